//! The ingest loop's index of pods: what each step needs of a pod (its node, phase,
//! scheduler, gang and PodGroup names), read once when the pod's object changes, and
//! the pods grouped by node, by gang and by PodGroup. The ingest applies the
//! informer's change set to it each pass and gets back what the changes touched, so
//! a pod event costs work for that pod's node, gang, PodGroup and group only, never a
//! scan of every pod.
//!
//! Invariants: every pod in `pods` is in exactly the secondary sets its facts name
//! (checked by `assert_consistent` in tests); an update's `Touched` names the nodes,
//! PodGroups and pods of both the old and the new facts. Pure; owned by the ingest
//! loop (`kube::ingest`), rebuilt when it starts leading.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value;

use crate::kube::gangs::{self, PodGroupApi, ANNOTATION_TIMEOUT, GANG_PREFIX};
use crate::kube::informer::Key;
use crate::kube::objects::{claim_object_names, pod_ref, PodRef};

/// What the ingest needs of one pod, read from its object once per change.
#[derive(Debug, Clone)]
pub struct PodFacts {
    /// Namespace, name and uid.
    pub pod: PodRef,
    /// `spec.nodeName`, when bound.
    pub node: Option<String>,
    /// Phase Succeeded or Failed.
    pub finished: bool,
    /// `schedulerName` is gangway's.
    pub ours: bool,
    /// Has a deletion timestamp.
    pub terminating: bool,
    /// Marked with Koordinator's timeout annotation.
    pub timed_out: bool,
    /// The PodGroup it names (`spec.schedulingGroup`, a label or an annotation).
    pub pod_group: Option<String>,
    /// The API of that PodGroup.
    pub pod_group_api: Option<PodGroupApi>,
    /// The gang it names: its PodGroup, else Koordinator's gang name.
    pub gang: Option<String>,
    /// The gRPC group that names it (its `gangway.io/group` annotation): the ingest
    /// leaves it to that group.
    pub framework_group: Option<String>,
    /// Lists ResourceClaims (its devices depend on claim objects too).
    pub uses_claims: bool,
    /// The ResourceClaim objects it names, as far as known.
    pub claims: Vec<String>,
    /// The object itself (shared with the informer).
    pub object: Arc<Value>,
    /// When this replica first saw the pod (its creation time, then the order the
    /// index first saw it in): the order kube-scheduler's queue takes pods in.
    pub arrival: Arrival,
}

/// When a pod arrived: `metadata.creationTimestamp` (whole seconds), then the order this
/// replica's index first saw it in (which follows the watch, so creation order).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Arrival {
    /// `metadata.creationTimestamp` as written (RFC 3339, so it sorts as time does).
    pub created: String,
    /// The index's count of pods seen before this one.
    pub seen: u64,
}

impl PodFacts {
    /// Reads `object`; `None` without a name or uid (the API server always sets both).
    pub fn read(object: Arc<Value>, scheduler_name: &str) -> Option<Self> {
        let pod = pod_ref(&object)?;
        let node = object["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(str::to_string);
        let finished = matches!(
            object["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        let ours = object["spec"]["schedulerName"].as_str() == Some(scheduler_name);
        let terminating = !object["metadata"]["deletionTimestamp"].is_null();
        let timed_out =
            object["metadata"]["annotations"][ANNOTATION_TIMEOUT].as_str() == Some("true");
        let reference = gangs::pod_group_ref(&object);
        let pod_group_api = reference.map(|(api, _)| api);
        let pod_group = reference.map(|(_, name)| name.to_string());
        let gang = pod_group.clone().or_else(|| {
            object["metadata"]["annotations"][format!("{GANG_PREFIX}name").as_str()]
                .as_str()
                .map(str::to_string)
        });
        let uses_claims = object["spec"]["resourceClaims"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        let claims = claim_object_names(&object);
        let framework_group = crate::kube::named_pods::framework_group(&object).map(str::to_string);
        let arrival = Arrival {
            created: object["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            seen: 0,
        };
        Some(Self {
            arrival,
            pod,
            node,
            finished,
            ours,
            terminating,
            timed_out,
            pod_group,
            pod_group_api,
            gang,
            framework_group,
            uses_claims,
            claims,
            object,
        })
    }

    /// Bound to a node.
    pub fn bound(&self) -> bool {
        self.node.is_some()
    }

    /// Ours, unbound, not finished, not being deleted, not timed out, and not a
    /// framework's (a gRPC group names those): a pod to submit.
    pub fn pending_ours(&self) -> bool {
        self.ours
            && !self.bound()
            && !self.finished
            && !self.terminating
            && !self.timed_out
            && self.framework_group.is_none()
    }

    fn namespaced(&self, name: &Option<String>) -> Option<Key> {
        name.as_ref()
            .map(|n| (self.pod.namespace.clone(), n.clone()))
    }
}

/// What an update touched: the ingest's steps look at these and nothing else.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Touched {
    /// Pods added, changed or removed.
    pub pods: BTreeSet<Key>,
    /// Pods (uids) that were removed or replaced by a pod of another uid.
    pub deleted: Vec<PodRef>,
    /// Pods whose facts before the change were these (uids of changed pods).
    pub uids: BTreeSet<String>,
    /// Nodes that gained or lost a pod, or whose pods changed.
    pub nodes: BTreeSet<String>,
    /// PodGroups (namespace, name) whose member pods changed.
    pub pod_groups: BTreeSet<Key>,
}

/// The pods, by key, node, gang and PodGroup.
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<Key, PodFacts>,
    on_node: HashMap<String, BTreeSet<Key>>,
    in_gang: HashMap<Key, BTreeSet<Key>>,
    in_pod_group: HashMap<Key, BTreeSet<Key>>,
    with_claims: BTreeSet<Key>,
    /// ResourceClaim (namespace, name) → the pods naming it.
    by_claim: HashMap<Key, BTreeSet<Key>>,
    /// Pods seen so far (a pod's `Arrival::seen`).
    seen: u64,
}

fn add<K: std::hash::Hash + Eq>(index: &mut HashMap<K, BTreeSet<Key>>, at: Option<K>, key: &Key) {
    if let Some(at) = at {
        index.entry(at).or_default().insert(key.clone());
    }
}

fn remove<K: std::hash::Hash + Eq>(
    index: &mut HashMap<K, BTreeSet<Key>>,
    at: Option<K>,
    key: &Key,
) {
    if let Some(at) = at {
        if let Some(set) = index.get_mut(&at) {
            set.remove(key);
            if set.is_empty() {
                index.remove(&at);
            }
        }
    }
}

impl PodIndex {
    /// Sets the pod at `key` to `object` (`None`: deleted), recording in `touched`
    /// what it changed.
    pub fn update(
        &mut self,
        key: Key,
        object: Option<Arc<Value>>,
        scheduler_name: &str,
        touched: &mut Touched,
    ) {
        let mut new = object.and_then(|o| PodFacts::read(o, scheduler_name));
        let old = self.unlink(&key);
        if let Some(new) = &mut new {
            new.arrival.seen = match &old {
                Some(old) if old.pod.uid == new.pod.uid => old.arrival.seen,
                _ => self.next_seen(),
            };
        }
        if let Some(old) = &old {
            touched.uids.insert(old.pod.uid.clone());
            if new.as_ref().map(|n| &n.pod.uid) != Some(&old.pod.uid) {
                touched.deleted.push(old.pod.clone());
            }
            Self::touch(old, touched);
        }
        if let Some(new) = new {
            Self::touch(&new, touched);
            self.link(key.clone(), new);
        }
        touched.pods.insert(key);
    }

    /// Replaces the whole index with `objects` (after a re-list, or when the ingest
    /// starts leading); everything counts as touched, and pods no longer there as deleted.
    pub fn rebuild<'a>(
        &mut self,
        objects: impl IntoIterator<Item = (&'a Key, &'a Arc<Value>)>,
        scheduler_name: &str,
    ) -> Touched {
        let old = std::mem::take(self);
        self.seen = old.seen;
        let seen_before: HashMap<&str, u64> = old
            .pods
            .values()
            .map(|f| (f.pod.uid.as_str(), f.arrival.seen))
            .collect();
        let mut touched = Touched::default();
        for (key, object) in objects {
            if let Some(mut facts) = PodFacts::read(object.clone(), scheduler_name) {
                facts.arrival.seen = match seen_before.get(facts.pod.uid.as_str()) {
                    Some(seen) => *seen,
                    None => self.next_seen(),
                };
                Self::touch(&facts, &mut touched);
                touched.pods.insert(key.clone());
                self.link(key.clone(), facts);
            }
        }
        for (key, facts) in old.pods {
            touched.uids.insert(facts.pod.uid.clone());
            if self.pods.get(&key).map(|n| &n.pod.uid) != Some(&facts.pod.uid) {
                touched.deleted.push(facts.pod.clone());
            }
            Self::touch(&facts, &mut touched);
            touched.pods.insert(key);
        }
        touched
    }

    fn touch(facts: &PodFacts, touched: &mut Touched) {
        if let Some(node) = &facts.node {
            touched.nodes.insert(node.clone());
        }
        if let Some(group) = facts.namespaced(&facts.pod_group) {
            touched.pod_groups.insert(group);
        }
    }

    fn next_seen(&mut self) -> u64 {
        self.seen += 1;
        self.seen
    }

    fn link(&mut self, key: Key, facts: PodFacts) {
        add(&mut self.on_node, facts.node.clone(), &key);
        add(&mut self.in_gang, facts.namespaced(&facts.gang), &key);
        add(
            &mut self.in_pod_group,
            facts.namespaced(&facts.pod_group),
            &key,
        );
        if facts.uses_claims {
            self.with_claims.insert(key.clone());
        }
        for claim in &facts.claims {
            add(
                &mut self.by_claim,
                Some((facts.pod.namespace.clone(), claim.clone())),
                &key,
            );
        }
        self.pods.insert(key, facts);
    }

    fn unlink(&mut self, key: &Key) -> Option<PodFacts> {
        let facts = self.pods.remove(key)?;
        remove(&mut self.on_node, facts.node.clone(), key);
        remove(&mut self.in_gang, facts.namespaced(&facts.gang), key);
        remove(
            &mut self.in_pod_group,
            facts.namespaced(&facts.pod_group),
            key,
        );
        self.with_claims.remove(key);
        for claim in &facts.claims {
            remove(
                &mut self.by_claim,
                Some((facts.pod.namespace.clone(), claim.clone())),
                key,
            );
        }
        Some(facts)
    }

    /// The pod at `key`.
    pub fn get(&self, key: &Key) -> Option<&PodFacts> {
        self.pods.get(key)
    }

    /// The pod `pod` names, if it is still there under the same uid.
    pub fn same(&self, pod: &PodRef) -> Option<&PodFacts> {
        self.pods
            .get(&(pod.namespace.clone(), pod.name.clone()))
            .filter(|f| f.pod.uid == pod.uid)
    }

    /// Whether `pod` is still there under its uid and has not finished.
    pub fn alive(&self, pod: &PodRef) -> bool {
        self.same(pod).is_some_and(|f| !f.finished)
    }

    /// The pods bound to `node`.
    pub fn on_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a PodFacts> + 'a {
        self.members(self.on_node.get(node))
    }

    /// The pods naming gang `name` in `namespace`.
    pub fn in_gang<'a>(
        &'a self,
        namespace: &str,
        name: &str,
    ) -> impl Iterator<Item = &'a PodFacts> + 'a {
        self.members(self.in_gang.get(&(namespace.to_string(), name.to_string())))
    }

    /// The pods naming PodGroup `group` of `api`.
    pub fn in_pod_group<'a>(
        &'a self,
        api: PodGroupApi,
        group: &Key,
    ) -> impl Iterator<Item = &'a PodFacts> + 'a {
        self.members(self.in_pod_group.get(group))
            .filter(move |f| f.pod_group_api == Some(api))
    }

    /// The nodes of bound pods that list ResourceClaims (their devices change with claims).
    pub fn nodes_with_claims(&self) -> BTreeSet<String> {
        self.with_claims
            .iter()
            .filter_map(|k| self.pods.get(k)?.node.clone())
            .collect()
    }

    /// The nodes of bound pods that name any of `claims` (namespace, name).
    pub fn nodes_using_claims<'a>(
        &self,
        claims: impl IntoIterator<Item = &'a Key>,
    ) -> BTreeSet<String> {
        claims
            .into_iter()
            .flat_map(|claim| self.members(self.by_claim.get(claim)))
            .filter_map(|f| f.node.clone())
            .collect()
    }

    /// The pods, finished ones left out, that name ResourceClaim `claim` (namespace, name).
    pub fn naming_claim<'a>(&'a self, claim: &Key) -> impl Iterator<Item = &'a PodFacts> + 'a {
        self.members(self.by_claim.get(claim))
            .filter(|f| !f.finished)
    }

    /// Number of pods (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.pods.len()
    }

    fn members<'a>(
        &'a self,
        keys: Option<&'a BTreeSet<Key>>,
    ) -> impl Iterator<Item = &'a PodFacts> + 'a {
        keys.into_iter()
            .flatten()
            .filter_map(move |k| self.pods.get(k))
    }

    /// Panics if a secondary set disagrees with the facts (tests).
    #[cfg(test)]
    pub fn assert_consistent(&self) {
        let mut expected = PodIndex::default();
        for (key, facts) in &self.pods {
            expected.link(key.clone(), facts.clone());
        }
        assert_eq!(expected.on_node, self.on_node, "on_node");
        assert_eq!(expected.in_gang, self.in_gang, "in_gang");
        assert_eq!(expected.in_pod_group, self.in_pod_group, "in_pod_group");
        assert_eq!(expected.with_claims, self.with_claims, "with_claims");
        assert_eq!(expected.by_claim, self.by_claim, "by_claim");
    }
}

#[cfg(test)]
#[path = "pod_index_tests.rs"]
mod tests;
