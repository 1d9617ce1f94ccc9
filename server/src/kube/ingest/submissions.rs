//! Submissions: ElasticQuotas turned into queues, and pending pods gathered into gang
//! groups (with their shared claims and the members already bound) and submitted to
//! meta. Part of [`Ingest`]'s `impl`.

use super::*;

impl Ingest {
    /// Keeps a queue for every ElasticQuota (named after its namespace) and deletes the
    /// queues of ElasticQuotas gone; a queue with live groups is deleted once they end.
    /// Compared with meta's queues every pass (a local read), so a write only follows a
    /// change.
    pub(super) async fn sync_queues(&mut self) {
        let objects: Vec<Arc<Value>> = self
            .cache
            .read(Slot::ElasticQuotas, |o| o.values().cloned().collect());
        let (wanted, problems) = queues::queues_of(objects.iter().map(|o| o.as_ref()));
        for (subject, message) in problems {
            self.warn_once(&subject, &message);
        }
        let current: Vec<QueueSpec> = match self.groups.meta_query_local(&MetaQuery::Queues) {
            Ok(MetaReply::Queues { queues }) => queues.into_iter().map(|q| q.spec).collect(),
            _ => return,
        };
        let kept_before: BTreeMap<&str, &QueueSpec> = current
            .iter()
            .filter(|q| q.managed_by.starts_with("ElasticQuota "))
            .map(|q| (q.name.as_str(), q))
            .collect();
        let mut writes = Vec::new();
        for (name, spec) in &wanted {
            if kept_before.get(name.as_str()) != Some(&spec) {
                writes.push(MetaCommand::PutQueue {
                    queue: spec.clone(),
                });
            }
        }
        for (name, spec) in &kept_before {
            if !wanted.contains_key(*name) {
                writes.push(MetaCommand::DeleteQueue {
                    name: name.to_string(),
                    managed_by: spec.managed_by.clone(),
                });
            }
        }
        // A namespace's pods are charged to the queue its ElasticQuota keeps: only once
        // meta holds it as kept (a queue the admin API made under that name is not it),
        // which is before this pass's writes, or by one of them.
        let mut kept: BTreeSet<String> = wanted
            .keys()
            .filter(|n| kept_before.contains_key(n.as_str()))
            .cloned()
            .collect();
        let mut specs: BTreeMap<String, QueueSpec> = current
            .iter()
            .map(|q| (q.name.clone(), q.clone()))
            .collect();
        for cmd in writes {
            let subject = match &cmd {
                MetaCommand::PutQueue { queue } => queue.managed_by.clone(),
                MetaCommand::DeleteQueue { managed_by, .. } => managed_by.clone(),
                _ => String::new(),
            };
            match self.groups.meta(&cmd).await {
                Ok(MetaReply::Rejected { reason, .. }) => {
                    self.warn_once(&subject, &format!("{subject}: {reason}"));
                }
                Ok(_) => {
                    self.memory.reported.remove(&subject);
                    if let MetaCommand::PutQueue { queue } = &cmd {
                        kept.insert(queue.name.clone());
                        specs.insert(queue.name.clone(), queue.clone());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "syncing queues failed; retrying next pass"),
            }
        }
        self.memory.kept_queues = kept;
        self.memory.queue_specs = specs;
    }

    /// Submits the pending pods of ours not yet submitted, when something that decides
    /// them changed (a pod, a PodGroup, a claim, a submission given up). Not before the
    /// pools the shards offer were compared with the slices: a pool whose slices went
    /// while no leader watched must not be given out meanwhile.
    pub(super) async fn submit_pending(&mut self) {
        if !self.memory.offered_read {
            return;
        }
        if !std::mem::take(&mut self.memory.waiting_dirty) || self.memory.waiting.is_empty() {
            return;
        }
        let pod_groups = self.pod_groups();
        let claims: ClaimIndex = self.cache.read(Slot::ResourceClaims, |o| o.clone());
        let mut ready = Vec::new();
        let mut problems = Vec::new();
        let mut queue_of: HashMap<String, String> = HashMap::new();
        let mut unhonoured = Vec::new();
        for key in &self.memory.waiting {
            let Some(facts) = self.memory.pods.get(key) else {
                continue;
            };
            let (queue, not_honoured) = queues::queue_of_pod(
                &facts.object,
                &self.memory.kept_queues,
                &self.memory.queue_specs,
            );
            if let Some(why) = not_honoured {
                let subject = format!("queue label in namespace {}", facts.pod.namespace);
                unhonoured.push((subject, why));
            }
            let queue = match volcano_queue(facts, &pod_groups, &self.memory.queue_specs) {
                Ok(Some(q)) => q,
                Ok(None) => queue,
                Err(why) => {
                    problems.push((facts.pod.clone(), PodProblem::Invalid(why)));
                    continue;
                }
            };
            queue_of.insert(facts.pod.uid.clone(), queue);
            let ignored = facts.pod_group_api == Some(PodGroupApi::Kubernetes)
                && self
                    .opts
                    .failpoints
                    .armed(failpoints::KUBERNETES_POD_GROUPS_IGNORED);
            let identity = match gangs::identify(&facts.object, &pod_groups) {
                _ if ignored => Identity::Single,
                Ok(i) => i,
                Err(p) => {
                    problems.push((facts.pod.clone(), p));
                    continue;
                }
            };
            let spec = objects::pod_spec(&facts.object, &claims).and_then(|(mut spec, names)| {
                self.share_claims(facts, &mut spec, &names, &claims)?;
                Ok(spec)
            });
            match spec {
                Ok(spec) => ready.push(ReadyPod {
                    arrival: facts.arrival.clone(),
                    pod: facts.pod.clone(),
                    spec,
                    identity,
                    run_limit_ms: facts.object["spec"]["activeDeadlineSeconds"]
                        .as_u64()
                        .and_then(|s| s.checked_mul(1_000)),
                }),
                Err(p) => problems.push((facts.pod.clone(), p)),
            }
        }
        for (subject, why) in unhonoured {
            self.warn_once(&subject, &why);
        }
        let bound_per_gang = self.bound_per_gang(&ready, &pod_groups);
        let satisfied = gangs::apply_match_policies(&mut ready, &bound_per_gang);
        for (pod, problem) in problems {
            match problem {
                PodProblem::Invalid(why) => {
                    self.pod_group_unschedulable(std::slice::from_ref(&pod), &why);
                    self.failed_scheduling(&pod, &why).await;
                }
                PodProblem::Missing(why) => {
                    self.failed_scheduling(&pod, &why).await;
                }
                PodProblem::Waiting(_) => {}
            }
        }
        let mut submissions = gangs::submissions(&ready, &satisfied);
        for s in &mut submissions {
            // A group is charged to one queue: its first pod's.
            if let Some(q) = s.pods.first().and_then(|p| queue_of.get(&p.uid)) {
                s.group.queue = q.clone();
            }
        }
        for chunk in submissions.chunks(SUBMIT_BATCH_MAX) {
            if !self.submit(chunk).await {
                // Looked at again next pass.
                self.memory.waiting_dirty = true;
            }
        }
    }

    /// Records in `spec` the ResourceClaims the pod shares with other pods of its gang:
    /// a claim it carries stays among its claims, one it follows leaves them (its
    /// carrier allocates it). Refuses a claim shared beyond the gang.
    pub(super) fn share_claims(
        &self,
        facts: &PodFacts,
        spec: &mut PodSpec,
        names: &BTreeMap<String, String>,
        claims: &ClaimIndex,
    ) -> Result<(), PodProblem> {
        for (claim, object_name) in names {
            let key = (facts.pod.namespace.clone(), object_name.clone());
            let others: Vec<objects::Sharer> = self
                .memory
                .pods
                .naming_claim(&key)
                .filter(|f| f.pod.uid != facts.pod.uid)
                .map(|f| objects::Sharer {
                    name: f.pod.name.clone(),
                    uid: f.pod.uid.clone(),
                    ours: f.ours,
                    gang: f.gang.clone(),
                    placed: f.bound() || self.memory.submitted.contains_key(&f.pod.uid),
                    going: f.terminating,
                })
                .collect();
            let role = objects::share_role(
                &facts.object,
                facts.gang.as_deref(),
                claim,
                object_name,
                claims.get(&key).map(|o| o.as_ref()),
                &others,
            )?;
            // A claim the pod names directly may gain sharers later: its first pod carries
            // it, so that they find it carried. A claim made from a template is the pod's own.
            if role == ShareRole::Alone && !objects::names_claim_directly(&facts.object, claim) {
                continue;
            }
            if role == ShareRole::Follower {
                spec.claims.retain(|c| &c.name != claim);
            }
            spec.shares.push(ClaimShare {
                pod_claim: claim.clone(),
                claim: format!("{}/{object_name}", facts.pod.namespace),
            });
        }
        Ok(())
    }

    /// The bound pods of ours of each gang that `ready` pods belong to.
    pub(super) fn bound_per_gang(
        &self,
        ready: &[ReadyPod],
        pod_groups: &PodGroups,
    ) -> BTreeMap<GangId, BoundPods> {
        let mut counted: BTreeMap<GangId, BoundPods> = BTreeMap::new();
        for pod in ready {
            let Identity::Gang(g) = &pod.identity else {
                continue;
            };
            if counted.contains_key(&g.id) {
                continue;
            }
            let Some(indexed) = self.memory.pods.same(&pod.pod).and_then(|f| f.gang.clone()) else {
                continue;
            };
            counted.insert(
                g.id.clone(),
                self.bound_of_gang(&g.id, &indexed, pod_groups),
            );
        }
        counted
    }

    /// The bound pods of ours that gang `id` counts as its own, among the pods the pod
    /// index files under gang name `indexed` (a PodGroup's name, for every gang of its
    /// tasks).
    pub(super) fn bound_of_gang(
        &self,
        id: &GangId,
        indexed: &str,
        pod_groups: &PodGroups,
    ) -> BoundPods {
        let mut bound = BoundPods::default();
        let members = self.memory.pods.in_gang(&id.namespace, indexed);
        for facts in members.filter(|f| f.ours && f.bound()) {
            if let Ok(Identity::Gang(p)) = gangs::identify(&facts.object, pod_groups) {
                if p.id == *id {
                    bound.ever += 1;
                    if !facts.finished {
                        bound.running += 1;
                    }
                }
            }
        }
        bound
    }

    /// Proposes one batch of submissions; false when the meta group did not answer.
    pub(super) async fn submit(&mut self, chunk: &[gangs::Submission]) -> bool {
        let at_ms = now_ms();
        let commands = chunk
            .iter()
            .map(|s| MetaCommand::Submit {
                key: s.key.clone(),
                group: s.group.clone(),
                at_ms,
                live_max: None,
            })
            .collect();
        let replies = match self.groups.meta(&MetaCommand::Batch { commands }).await {
            Ok(MetaReply::Batch { replies }) => replies,
            Ok(other) => {
                tracing::warn!(reply = ?other, "unexpected reply to a submission batch");
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "submitting pods failed; retrying next pass");
                return false;
            }
        };
        tracing::info!(
            groups = chunk.len(),
            "submitted pending pods as gang groups"
        );
        for (s, reply) in chunk.iter().zip(replies) {
            match reply {
                MetaReply::Submitted { .. } => {
                    for p in &s.pods {
                        self.mark_submitted(p, &s.key);
                    }
                    self.memory.pods_of.insert(s.key.clone(), s.pods.clone());
                }
                MetaReply::Rejected { reason, .. } => {
                    for p in &s.pods {
                        self.failed_scheduling(p, &reason).await;
                    }
                }
                other => tracing::warn!(reply = ?other, "unexpected submission reply"),
            }
        }
        true
    }
}

/// The queue the Volcano PodGroup of `facts` names for it, if it is in one (see
/// [`queues::queue_of_volcano_group`]).
fn volcano_queue(
    facts: &PodFacts,
    pod_groups: &PodGroups,
    specs: &BTreeMap<String, gangway_core::model::queue::QueueSpec>,
) -> Result<Option<String>, String> {
    if facts.pod_group_api != Some(PodGroupApi::Volcano) {
        return Ok(None);
    }
    let Some(name) = &facts.pod_group else {
        return Ok(None);
    };
    match pod_groups
        .volcano
        .get(&(facts.pod.namespace.clone(), name.clone()))
    {
        Some(group) => queues::queue_of_volcano_group(group, &facts.pod.namespace, specs),
        None => Ok(None),
    }
}
