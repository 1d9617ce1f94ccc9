//! What the ingest tells Kubernetes: PodGroup status (of every PodGroup API), pod
//! conditions and events for groups that cannot be placed, and warnings logged once.
//! Part of [`Ingest`]'s `impl`.

use super::*;

impl Ingest {
    pub(super) fn pod_groups(&self) -> PodGroups {
        let mut groups = PodGroups::default();
        for slot in [Slot::PodGroupsSigs, Slot::PodGroupsX] {
            self.cache.read(slot, |o| {
                for (k, v) in o {
                    groups.plugins.insert(k.clone(), v.clone());
                }
            });
        }
        groups.kubernetes = self.cache.read(Slot::PodGroupsK8s, |o| o.clone());
        groups.volcano = self.cache.read(Slot::PodGroupsVolcano, |o| o.clone());
        groups.volcano_tiers =
            volcano_tiers(&self.opts.learned_topologies.merged(&self.opts.topologies));
        groups
    }

    /// Writes the status of the PodGroups marked since the last pass, where it changed:
    /// scheduler-plugins' phase and counts, Kubernetes' `PodGroupScheduled` condition,
    /// Volcano's phase, counts and condition. A failed write stays marked.
    pub(super) async fn write_pod_group_status(&mut self) {
        let dirty = std::mem::take(&mut self.memory.pod_groups_dirty);
        for (ns, name) in dirty {
            let written = self.write_scheduled_condition(&ns, &name).await
                && self.write_volcano_status(&ns, &name).await;
            if !written {
                self.memory
                    .pod_groups_dirty
                    .insert((ns.clone(), name.clone()));
            }
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
                    .in_pod_group(PodGroupApi::SchedulerPlugins, &(ns.clone(), name.clone()))
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

    /// Writes the `PodGroupScheduled` condition of Kubernetes PodGroup `ns/name` (a gang
    /// policy's) where it changed; false when the write failed.
    async fn write_scheduled_condition(&mut self, ns: &str, name: &str) -> bool {
        let key = (ns.to_string(), name.to_string());
        let memo = (Slot::PodGroupsK8s, key.0.clone(), key.1.clone());
        let reason_key = (PodGroupApi::Kubernetes, key.clone());
        let Some(group) = self.cache.get(Slot::PodGroupsK8s, ns, name) else {
            self.memory.pod_group_status.remove(&memo);
            self.memory.pod_group_unschedulable.remove(&reason_key);
            return true;
        };
        let Some(min) = group["spec"]["schedulingPolicy"]["gang"]["minCount"].as_u64() else {
            return true;
        };
        let members: Vec<&Value> = self
            .memory
            .pods
            .in_pod_group(PodGroupApi::Kubernetes, &key)
            .map(|f| f.object.as_ref())
            .collect();
        let why = self.memory.pod_group_unschedulable.get(&reason_key);
        let Some(now) = gangs::pod_group_scheduled(min, &members, why.map(String::as_str)) else {
            return true;
        };
        if now == gangs::GroupScheduled::Scheduled {
            // Once bound, a later shortfall (a pod gone) is no reason to say otherwise.
            self.memory.pod_group_unschedulable.remove(&reason_key);
        }
        let (status, reason, message) = now.condition();
        let said = json!({"status": status, "reason": reason, "message": message});
        if self.memory.pod_group_status.get(&memo) == Some(&said) {
            return true;
        }
        let Some(conditions) =
            gangs::with_scheduled_condition(&group, &now, &api::rfc3339(now_ms()))
        else {
            self.memory.pod_group_status.insert(memo, said);
            return true;
        };
        let path = format!(
            "/apis/{}/namespaces/{ns}/podgroups/{name}/status",
            Slot::PodGroupsK8s.resource().api_version
        );
        let patch = json!({"status": {"conditions": conditions}});
        match api::merge_patch(&self.client, &path, &patch).await {
            Ok(_) => {
                self.memory.pod_group_status.insert(memo, said);
                true
            }
            Err(e) => {
                tracing::debug!(pod_group = %format!("{ns}/{name}"), error = %e, "PodGroup condition not written");
                false
            }
        }
    }

    /// Writes the status of Volcano PodGroup `ns/name` (phase, counts, condition) where it
    /// changed; false when the write failed.
    async fn write_volcano_status(&mut self, ns: &str, name: &str) -> bool {
        let key = (ns.to_string(), name.to_string());
        let memo = (Slot::PodGroupsVolcano, key.0.clone(), key.1.clone());
        let reason_key = (PodGroupApi::Volcano, key.clone());
        let Some(group) = self.cache.get(Slot::PodGroupsVolcano, ns, name) else {
            self.memory.pod_group_status.remove(&memo);
            self.memory.pod_group_unschedulable.remove(&reason_key);
            return true;
        };
        let min = group["spec"]["minMember"].as_u64().unwrap_or(1).max(1);
        let members: Vec<&Value> = self
            .memory
            .pods
            .in_pod_group(PodGroupApi::Volcano, &key)
            .map(|f| f.object.as_ref())
            .collect();
        let why = self.memory.pod_group_unschedulable.get(&reason_key);
        let at = api::rfc3339(now_ms());
        let status = gangs::volcano_status(
            min,
            &members,
            why.map(String::as_str),
            &group["status"],
            &at,
        );
        if status["phase"] == "Running" {
            self.memory.pod_group_unschedulable.remove(&reason_key);
        }
        let current = &group["status"];
        let same = |f: &str| current[f] == status[f] || (current[f].is_null() && status[f] == 0);
        let said_conditions = |c: &Value| {
            c.as_array()
                .map(|list| {
                    list.iter()
                        .map(|c| (c["type"].clone(), c["reason"].clone(), c["message"].clone()))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        let unchanged = ["phase", "running", "succeeded", "failed"]
            .iter()
            .all(|f| same(f))
            && said_conditions(&current["conditions"]) == said_conditions(&status["conditions"]);
        if unchanged || self.memory.pod_group_status.get(&memo) == Some(&status) {
            return true;
        }
        let path = format!(
            "/apis/{}/namespaces/{ns}/podgroups/{name}/status",
            Slot::PodGroupsVolcano.resource().api_version
        );
        match api::merge_patch(&self.client, &path, &json!({"status": status})).await {
            Ok(_) => {
                self.memory.pod_group_status.insert(memo, status);
                true
            }
            Err(e) => {
                tracing::debug!(pod_group = %format!("{ns}/{name}"), error = %e, "Volcano PodGroup status not written");
                false
            }
        }
    }

    /// Records why the gang of the Kubernetes or Volcano PodGroup of `pods` cannot be
    /// placed, for the status gangway writes there.
    pub(super) fn pod_group_unschedulable(&mut self, pods: &[PodRef], why: &str) {
        for p in pods {
            let Some(facts) = self.memory.pods.same(p) else {
                continue;
            };
            let Some(api @ (PodGroupApi::Kubernetes | PodGroupApi::Volcano)) = facts.pod_group_api
            else {
                continue;
            };
            let Some(group) = facts.pod_group.clone() else {
                continue;
            };
            let key = (api, (p.namespace.clone(), group));
            if self
                .memory
                .pod_group_unschedulable
                .get(&key)
                .map(String::as_str)
                != Some(why)
            {
                self.memory
                    .pod_group_unschedulable
                    .insert(key.clone(), why.to_string());
                self.memory.pod_groups_dirty.insert(key.1);
            }
        }
    }

    /// Events for a group that cannot be placed, and the timeout mark for a timed-out
    /// one. False when a write failed.
    pub(super) async fn report(&mut self, s: &GroupSummary, pods: &[PodRef]) -> bool {
        let mut done = true;
        match s.state {
            GroupState::Queued if s.attempts > 0 && !s.reason.is_empty() => {
                self.pod_group_unschedulable(pods, &s.reason);
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
