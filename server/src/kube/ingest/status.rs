//! What the ingest tells Kubernetes: PodGroup status, pod conditions and events for
//! groups that cannot be placed, and warnings logged once. Part of [`Ingest`]'s
//! `impl`.

use super::*;

impl Ingest {
    pub(super) fn pod_groups(&self) -> PodGroupIndex {
        let mut index = PodGroupIndex::new();
        for slot in [Slot::PodGroupsSigs, Slot::PodGroupsX] {
            self.cache.read(slot, |o| {
                for (k, v) in o {
                    index.insert(k.clone(), v.clone());
                }
            });
        }
        index
    }

    /// Writes the status (phase, scheduled, running, succeeded, failed) of the
    /// PodGroups marked since the last pass, where it changed; a failed write stays marked.
    pub(super) async fn write_pod_group_status(&mut self) {
        let dirty = std::mem::take(&mut self.memory.pod_groups_dirty);
        for (ns, name) in dirty {
            for slot in [Slot::PodGroupsX, Slot::PodGroupsSigs] {
                let key = (slot, ns.clone(), name.clone());
                let Some(group) = self.cache.get(slot, &ns, &name) else {
                    self.memory.pod_group_status.remove(&key);
                    continue;
                };
                let min = group["spec"]["minMember"].as_u64().unwrap_or(1);
                let members: Vec<&Value> = self
                    .memory
                    .pods
                    .in_pod_group(&(ns.clone(), name.clone()))
                    .map(|f| f.object.as_ref())
                    .collect();
                let status = gangs::pod_group_status(min, &members);
                let current = &group["status"];
                let unchanged = ["phase", "scheduled", "running", "succeeded", "failed"]
                    .iter()
                    .all(|f| {
                        current[*f] == status[*f] || (current[*f].is_null() && status[*f] == 0)
                    });
                if unchanged || self.memory.pod_group_status.get(&key) == Some(&status) {
                    continue;
                }
                let resource = slot.resource();
                let path = format!(
                    "/apis/{}/namespaces/{ns}/podgroups/{name}/status",
                    resource.api_version
                );
                match api::merge_patch(&self.client, &path, &json!({"status": status})).await {
                    Ok(_) => {
                        self.memory.pod_group_status.insert(key, status);
                    }
                    Err(e) => {
                        tracing::debug!(pod_group = %format!("{ns}/{name}"), error = %e, "PodGroup status not written");
                        self.memory
                            .pod_groups_dirty
                            .insert((ns.clone(), name.clone()));
                    }
                }
            }
        }
    }

    /// Events for a group that cannot be placed, and the timeout mark for a timed-out
    /// one. False when a write failed.
    pub(super) async fn report(&mut self, s: &GroupSummary, pods: &[PodRef]) -> bool {
        let mut done = true;
        match s.state {
            GroupState::Queued if s.attempts > 0 && !s.reason.is_empty() => {
                for p in pods {
                    done &= self.failed_scheduling(p, &s.reason).await;
                }
            }
            GroupState::Done {
                how: Terminal::TimedOut,
            } => {
                for p in pods {
                    if self.memory.timed_out.contains(&p.uid) || !self.memory.pods.alive(p) {
                        continue;
                    }
                    let patch = json!({"metadata": {"annotations": {ANNOTATION_TIMEOUT: "true"}}});
                    match api::merge_patch(&self.client, &api::path_of(p), &patch).await {
                        Ok(_) => {
                            self.memory.timed_out.insert(p.uid.clone());
                            let why =
                                format!("gang timed out before it could be placed: {}", s.reason);
                            done &= self.failed_scheduling(p, &why).await;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %p, error = %e, "marking a timed-out pod failed");
                            done = false;
                        }
                    }
                }
            }
            _ => {}
        }
        done
    }

    /// Writes a FailedScheduling event for `pod` unless this reason was the last one
    /// reported; false when the write failed.
    pub(super) async fn failed_scheduling(&mut self, pod: &PodRef, why: &str) -> bool {
        if self.memory.reported.get(&pod.uid).map(String::as_str) == Some(why) {
            return true;
        }
        let result = api::pod_event(
            &self.client,
            &self.opts.scheduler_name,
            pod,
            EventType::Warning,
            "FailedScheduling",
            why,
            &api::rfc3339(now_ms()),
        )
        .await;
        match result {
            Ok(()) => {
                self.memory
                    .reported
                    .insert(pod.uid.clone(), why.to_string());
                true
            }
            Err(e) => {
                tracing::debug!(pod = %pod, error = %e, "FailedScheduling event not recorded");
                false
            }
        }
    }

    pub(super) fn warn_once(&mut self, subject: &str, message: &str) {
        if self.memory.reported.get(subject).map(String::as_str) != Some(message) {
            tracing::warn!("{message}");
            self.memory
                .reported
                .insert(subject.to_string(), message.to_string());
        }
    }
}
