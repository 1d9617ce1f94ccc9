//! Groups that follow their pods: pod, claim and PodGroup changes absorbed, and
//! members or whole groups released when their pods go or a Strict gang breaks. Part of
//! [`Ingest`]'s `impl`.

use super::*;

impl Ingest {
    /// Drops a group the meta log forgot, and which pods were submitted in it.
    pub(super) fn forget_group(&mut self, seq: GroupSeq) {
        let Some(summary) = self.memory.summaries.remove(&seq) else {
            return;
        };
        self.memory.seq_of.remove(&summary.key);
        self.memory.groups_dirty.remove(&summary.key);
        for pod in self.memory.pods_of.remove(&summary.key).unwrap_or_default() {
            if self.memory.submitted.get(&pod.uid) == Some(&summary.key) {
                self.unmark_submitted(&pod);
            }
        }
    }

    /// Records that `pod` was submitted in group `key`.
    pub(super) fn mark_submitted(&mut self, pod: &PodRef, key: &str) {
        self.memory
            .submitted
            .insert(pod.uid.clone(), key.to_string());
        self.memory
            .waiting
            .remove(&(pod.namespace.clone(), pod.name.clone()));
    }

    /// Forgets that `pod` was submitted: it waits to be submitted again if still
    /// pending, and counts as observed on its node if bound.
    pub(super) fn unmark_submitted(&mut self, pod: &PodRef) {
        self.memory.submitted.remove(&pod.uid);
        self.memory.waiting_dirty = true;
        if let Some(facts) = self.memory.pods.same(pod) {
            if let Some(node) = &facts.node {
                self.memory.observed_dirty.insert(node.clone());
            }
            if facts.pending_ours() {
                self.memory
                    .waiting
                    .insert((pod.namespace.clone(), pod.name.clone()));
            }
        }
    }

    /// Brings the pod index up to the informer's copy (whole on the first pass as
    /// leader or after a re-list, else the changed pods) and marks what changed.
    pub(super) fn take_pod_changes(&mut self) {
        let scheduler = self.opts.scheduler_name.clone();
        let changes = self.cache.take_changes(Slot::Pods);
        let touched = match changes {
            Changes::Keys(keys) if self.memory.pods_indexed => {
                let objects: Vec<(Key, Option<Arc<Value>>)> = self.cache.read(Slot::Pods, |o| {
                    keys.into_iter()
                        .map(|k| {
                            let object = o.get(&k).cloned();
                            (k, object)
                        })
                        .collect()
                });
                let mut touched = Touched::default();
                for (key, object) in objects {
                    self.memory
                        .pods
                        .update(key, object, &scheduler, &mut touched);
                }
                touched
            }
            _ => {
                self.memory.pods_indexed = true;
                let index = &mut self.memory.pods;
                self.cache
                    .read(Slot::Pods, |o| index.rebuild(o.iter(), &scheduler))
            }
        };
        self.absorb(touched);
    }

    /// Marks the nodes, groups, PodGroups and waiting pods `touched` concerns.
    pub(super) fn absorb(&mut self, touched: Touched) {
        self.note_framework_gone(&touched);
        let memory = &mut self.memory;
        if !touched.pods.is_empty() {
            memory.waiting_dirty = true;
        }
        memory.observed_dirty.extend(touched.nodes);
        memory.pod_groups_dirty.extend(touched.pod_groups);
        for uid in &touched.uids {
            if let Some(key) = memory.submitted.get(uid) {
                memory.groups_dirty.insert(key.clone());
            }
        }
        for pod in &touched.deleted {
            memory.reported.remove(&pod.uid);
            memory.timed_out.remove(&pod.uid);
        }
        for key in touched.pods {
            let waits = memory
                .pods
                .get(&key)
                .is_some_and(|f| f.pending_ours() && !memory.submitted.contains_key(&f.pod.uid));
            if waits {
                memory.waiting.insert(key);
            } else {
                memory.waiting.remove(&key);
            }
        }
    }

    /// A claim changed: the devices of the bound pods naming it may have (every bound
    /// pod with claims after a re-list), and waiting pods may have their claims now.
    pub(super) fn take_claim_changes(&mut self) {
        let nodes = match self.cache.take_changes(Slot::ResourceClaims) {
            Changes::All => self.memory.pods.nodes_with_claims(),
            Changes::Keys(keys) if keys.is_empty() => return,
            Changes::Keys(keys) => self.memory.pods.nodes_using_claims(&keys),
        };
        self.memory.observed_dirty.extend(nodes);
        self.memory.observed_network_dirty = true;
        self.memory.waiting_dirty = true;
    }

    /// A PodGroup changed: its status may need writing, and waiting pods may now be
    /// able to name their gang.
    pub(super) fn take_pod_group_changes(&mut self) {
        for slot in [
            Slot::PodGroupsSigs,
            Slot::PodGroupsX,
            Slot::PodGroupsK8s,
            Slot::PodGroupsVolcano,
        ] {
            let keys: BTreeSet<Key> = match self.cache.take_changes(slot) {
                Changes::All => {
                    let mut keys: BTreeSet<Key> =
                        self.cache.read(slot, |o| o.keys().cloned().collect());
                    // Those the re-list no longer has, so their memory goes too.
                    keys.extend(
                        self.memory
                            .pod_group_status
                            .keys()
                            .filter(|(s, _, _)| *s == slot)
                            .map(|(_, ns, name)| (ns.clone(), name.clone())),
                    );
                    keys
                }
                Changes::Keys(keys) => keys,
            };
            if !keys.is_empty() {
                self.memory.waiting_dirty = true;
            }
            self.memory.pod_groups_dirty.extend(keys);
        }
    }

    /// Looks at the groups marked since the last pass (a pod of theirs changed, or
    /// their summary moved): releases or cancels what lost pods, reports why a group
    /// waits, marks timed-out pods. A group whose write failed stays marked.
    pub(super) async fn check_groups(&mut self) {
        let dirty = std::mem::take(&mut self.memory.groups_dirty);
        for key in dirty {
            let summary = self
                .memory
                .seq_of
                .get(&key)
                .and_then(|seq| self.memory.summaries.get(seq))
                .cloned();
            let (Some(s), Some(pods)) = (summary, self.memory.pods_of.get(&key).cloned()) else {
                continue;
            };
            let released = self.release_gone(&s, &pods).await;
            let reported = self.report(&s, &pods).await;
            if !(released && reported) {
                self.memory.groups_dirty.insert(key);
            }
        }
    }

    /// Releases placed members of `s` whose pods are gone or finished; cancels it if
    /// queued and it lost a pod (its other pods are submitted again); forgets its
    /// pods' submission once cancelled. False when a write failed.
    pub(super) async fn release_gone(&mut self, s: &GroupSummary, pods: &[PodRef]) -> bool {
        let gone: Vec<&PodRef> = pods.iter().filter(|p| !self.memory.pods.alive(p)).collect();
        match s.state {
            GroupState::Placed if !gone.is_empty() => {
                if let Some(why) = self.strict_gang_broken(s, pods) {
                    return self.release_whole(s, pods, &why).await;
                }
                let names = placed_members(s, |key| {
                    gone.iter()
                        .any(|p| p.namespace == key.namespace && p.name == key.member)
                });
                if names.is_empty() {
                    return true;
                }
                if !self.release(s.seq, names, "members of gone pods").await {
                    return false;
                }
            }
            GroupState::Queued | GroupState::Placing { .. } if !gone.is_empty() => {
                let cmd = MetaCommand::Cancel {
                    seq: s.seq,
                    at_ms: now_ms(),
                };
                if let Err(e) = self.groups.meta(&cmd).await {
                    tracing::warn!(group = s.seq, error = %e, "cancelling a group that lost a pod failed");
                    return false;
                }
            }
            GroupState::Done {
                how: Terminal::Cancelled,
            } => {
                for p in pods {
                    if self.memory.submitted.get(&p.uid) == Some(&s.key) {
                        self.unmark_submitted(p);
                    }
                }
            }
            _ => {}
        }
        true
    }

    /// Why a placed group must be released whole: one of its Strict gangs has fewer
    /// live pods than its minMember (less what its match policy credits it for pods of
    /// the gang bound before, for a group that tops a gang up) and none of the group's
    /// pods is bound yet (a bound pod cannot be taken back, so after the first binding
    /// the group stays).
    pub(super) fn strict_gang_broken(&self, s: &GroupSummary, pods: &[PodRef]) -> Option<String> {
        let pod_groups = self.pod_groups();
        let mut live: BTreeMap<GangId, (u32, GangParams, String)> = BTreeMap::new();
        for p in pods {
            let Some(facts) = self.memory.pods.same(p).filter(|f| !f.finished) else {
                continue;
            };
            if facts.bound() {
                return None;
            }
            if let Ok(Identity::Gang(g)) = gangs::identify(&facts.object, &pod_groups) {
                let indexed = facts.gang.clone().unwrap_or_default();
                live.entry(g.id.clone()).or_insert((0, g, indexed)).0 += 1;
            }
        }
        // The group declares each gang under its own name, or topping it up.
        let declares = |id: &GangId, name: &str| {
            id.to_string() == name || gangs::topped_up(id, &s.key).to_string() == name
        };
        // A gang of the group with no live pod at all cannot reach any minMember.
        if let Some(gone) = s
            .gangs
            .iter()
            .find(|g| !live.keys().any(|id| declares(id, g)))
        {
            return Some(format!(
                "gang {gone} lost every pod before binding; the group's placement is released and it waits for members again"
            ));
        }
        live.values()
            .map(|(n, g, indexed)| {
                let bound = self.bound_of_gang(&g.id, indexed, &pod_groups);
                (n + g.match_policy.credit(bound), g)
            })
            .find(|(n, g)| g.mode == GangMode::Strict && *n < g.min_member)
            .map(|(n, g)| {
                format!(
                    "gang {} (Strict) lost a pod before binding: {n} of minMember {} left; its placement is released and it waits for members again",
                    g.id, g.min_member
                )
            })
    }

    /// Releases members `names` of group `seq` (`what` names them in logs); false when
    /// the next pass must try again: the release failed, or a shard move holds it a
    /// moment (meta refused it as busy).
    pub(super) async fn release(&self, seq: GroupSeq, names: Vec<String>, what: &str) -> bool {
        match release_members(&self.groups, seq, names).await {
            Err(e) => {
                tracing::warn!(group = seq, error = %e, "releasing {what} failed; retrying next pass");
                false
            }
            Ok(MetaReply::Rejected {
                kind: RejectionKind::Busy,
                reason,
            }) => {
                tracing::info!(
                    group = seq,
                    reason,
                    "releasing {what} waits for a shard move"
                );
                false
            }
            Ok(_) => true,
        }
    }

    /// Releases every placement of group `s` and forgets its live pods' submission, so
    /// they are submitted again once their gangs are ready.
    pub(super) async fn release_whole(
        &mut self,
        s: &GroupSummary,
        pods: &[PodRef],
        why: &str,
    ) -> bool {
        let names = placed_members(s, |_| true);
        if !self.release(s.seq, names, "a broken Strict gang").await {
            return false;
        }
        tracing::info!(group = s.seq, reason = %why, "released a Strict gang that lost a pod");
        for p in pods {
            self.unmark_submitted(p);
            if self.memory.pods.alive(p) {
                self.failed_scheduling(p, why).await;
            }
        }
        true
    }
}
