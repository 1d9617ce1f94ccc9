//! Pods a gRPC group names (a framework's pods, `kube::named_pods`): the ingest never
//! submits them (`PodFacts::pending_ours`), counts one bound for the group that holds
//! its member as that member's rather than as observed, and releases the member once
//! its pod goes or finishes, as it does for the pods it submitted. A new leader reads
//! which framework pods the shards hold bound (`ShardQuery::NamedBound`), so one deleted
//! while no replica led the ingest is released too. Part of [`Ingest`]'s `impl`.

use super::*;

/// Bound framework pods read from one shard when leading starts, at most.
pub const NAMED_BOUND_READ_MAX: u32 = 100_000;

impl Ingest {
    /// Once per leadership, after the pod index is built: the framework pods the shards
    /// hold bound are noted as held while alive, and their members released when gone (or
    /// replaced by another pod of the name). A shard that does not answer is asked again
    /// next pass.
    pub(super) async fn recover_framework_bound(&mut self) {
        if self.memory.framework_recovered || !self.memory.pods_indexed {
            return;
        }
        let mut bound = Vec::new();
        for shard in self.shards.ids() {
            let query = ShardQuery::NamedBound {
                limit: NAMED_BOUND_READ_MAX,
            };
            match self.groups.shard_query(shard, &query).await {
                Ok(ShardAnswer::NamedBound { members }) => bound.extend(members),
                Ok(other) => {
                    tracing::warn!(shard, answer = ?other, "unexpected answer to NamedBound");
                    return;
                }
                Err(e) => {
                    tracing::debug!(shard, error = %e, "bound framework pods not read; next pass");
                    return;
                }
            }
        }
        for (member, uid) in bound {
            let gang = format!("{}/{}", member.namespace, member.gang);
            let record = match self
                .groups
                .meta_query_local(&MetaQuery::OwnersOf { gangs: vec![gang] })
            {
                Ok(MetaReply::Groups { mut records }) if !records.is_empty() => records.remove(0),
                _ => continue,
            };
            let key = member.to_string();
            let Some(pod) = record.pod_of(&member) else {
                continue;
            };
            if !record.placements.to_map().contains_key(&key) {
                continue;
            }
            let pod_name = pod.rsplit('/').next().unwrap_or_default().to_string();
            let name = (member.namespace.clone(), pod_name);
            let alive = self
                .memory
                .pods
                .get(&name)
                .is_some_and(|f| f.pod.uid == uid && !f.finished);
            if alive {
                self.memory.framework_bound.insert(uid, (record.seq, key));
            } else {
                self.memory
                    .framework_gone
                    .entry(record.seq)
                    .or_default()
                    .insert(key);
            }
        }
        self.memory.framework_recovered = true;
    }

    /// The group and member (key) that hold framework pod `f` where it is bound: the
    /// live group named by its annotation, whose member naming it is placed on its node.
    pub(super) fn framework_holder(&self, f: &PodFacts) -> Option<(GroupSeq, String)> {
        let (group, node) = (f.framework_group.as_deref()?, f.node.as_deref()?);
        if !f.ours {
            return None;
        }
        let pod = format!("{}/{}", f.pod.namespace, f.pod.name);
        let record = match self
            .groups
            .meta_query_local(&MetaQuery::NamedPod { pod: pod.clone() })
        {
            Ok(MetaReply::Groups { mut records }) if !records.is_empty() => records.remove(0),
            _ => return None,
        };
        if record.group.id != group {
            return None;
        }
        let (member, _) = record.named_pods().into_iter().find(|(_, p)| *p == pod)?;
        let key = member.to_string();
        let placed_here = record
            .placements
            .to_map()
            .get(&key)
            .is_some_and(|p| p.node == node);
        placed_here.then_some((record.seq, key))
    }

    /// Notes the framework pods among `touched` that went or finished while bound for
    /// their group: their members are released next ([`Self::release_framework_gone`]).
    pub(super) fn note_framework_gone(&mut self, touched: &Touched) {
        let memory = &mut self.memory;
        if memory.framework_bound.is_empty() {
            return;
        }
        let finished = touched
            .pods
            .iter()
            .filter_map(|k| memory.pods.get(k))
            .filter(|f| f.finished)
            .map(|f| f.pod.uid.clone());
        let deleted = touched.deleted.iter().map(|p| p.uid.clone());
        let gone: Vec<String> = finished.chain(deleted).collect();
        for uid in gone {
            if let Some((seq, member)) = memory.framework_bound.remove(&uid) {
                memory.framework_gone.entry(seq).or_default().insert(member);
            }
        }
    }

    /// Releases the members whose framework pods went or finished; a group whose
    /// release failed is tried again next pass.
    pub(super) async fn release_framework_gone(&mut self) {
        let gone = std::mem::take(&mut self.memory.framework_gone);
        for (seq, members) in gone {
            let names: Vec<String> = members.iter().cloned().collect();
            if !self
                .release(seq, names, "members whose named pods are gone")
                .await
            {
                self.memory.framework_gone.insert(seq, members);
            }
        }
    }
}
