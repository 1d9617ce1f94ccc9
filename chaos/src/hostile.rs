//! The careless and hostile client of a drill: public operations in the states the
//! ordinary cycle never calls them in, reused idempotency keys, duplicate gangs,
//! internal RPCs with a client's credentials, and malformed values. Each probe is
//! recorded in the history like any operation; the checker judges the replies
//! (a refusal that must come, [`MUST_FAIL`]) and the final ledgers (I3, I5).
//!
//! The reference model is the one the checker keeps over the history: a group's
//! state and members follow only from acknowledged operations, so a refused call
//! that changed something, or an accepted call that must not be, shows up there.
//! Who calls it: the workload's workers.

use std::time::Duration;

use gangway_proto::raft::raft_transport_client::RaftTransportClient;
use gangway_proto::raft::{Envelope, ProposeManyRequest, ProposeRequest, RaftRequest};
use gangway_proto::v1::{GangSpec, MemberSpec, SubmitGangGroupRequest};

use crate::history::{Event, GangShape};
use crate::rng::Rng;
use crate::workload::{gangs_of, placed_of, request_of, CallResult, Shape, Workload, NAMESPACE};

/// Operations that must be refused: an acknowledgement of any of them is a violation.
pub const MUST_FAIL: [&str; 4] = [
    F_PLACE_CONFLICTING,
    F_PLACE_DUPLICATE_GANG,
    F_RAFT_AS_CLIENT,
    F_ODD,
];
/// A reused idempotency key with another body.
pub const F_PLACE_CONFLICTING: &str = "place_conflicting";
/// A new group declaring a gang a live group holds.
pub const F_PLACE_DUPLICATE_GANG: &str = "place_duplicate_gang";
/// A Raft transport call with a client's credentials.
pub const F_RAFT_AS_CLIENT: &str = "raft_as_client";
/// A malformed request.
pub const F_ODD: &str = "odd";
/// Time one Raft transport call may take, in ms.
pub const RAFT_CALL_TIMEOUT_MS: u64 = 1_000;
/// Replica node ids a forged envelope is addressed to (drills run 3 or 5 replicas).
pub const FORGED_NODES_MAX: u64 = 5;

/// The probes, chosen uniformly.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// A NonStrict group that holds two members and waits for a third that never
    /// fits: ReleaseMembers and Release while it is Queued, then left for the end.
    Accumulating,
    /// Release, Cancel or ReleaseMembers right after submitting (Queued or Placing),
    /// then both again once the group ended.
    Early,
    /// A placed group's key reused with the same body (same group) and another body
    /// (refused), and its gang declared by a new group (refused).
    Reuse,
    /// A placed group released, and ReleaseMembers, Cancel and Release again sent with
    /// it, so some land while it is Releasing.
    Releasing,
    /// A group no node can hold, with a short waitTime: once it timed out,
    /// ReleaseMembers, Release and Cancel on it.
    TimedOut,
    /// The Raft transport called as a client would.
    RaftAsClient,
    /// A malformed request.
    Odd,
}

const PROBES: [Probe; 7] = [
    Probe::RaftAsClient,
    Probe::Accumulating,
    Probe::Reuse,
    Probe::Early,
    Probe::Odd,
    Probe::Releasing,
    Probe::TimedOut,
];

/// waitTime of the probe's group that times out, in ms.
pub const TIMED_OUT_WAIT_MS: u64 = 300;

/// How a forged Raft transport call ended.
enum Forged {
    /// The transport served it (whatever its answer): a violation.
    Served(String),
    /// Refused as unauthenticated.
    Refused(String),
    /// The replica could not be reached.
    Unreachable(String),
}

impl Forged {
    /// Whether `status` was made on this side from a transport failure (connect refused,
    /// connection reset mid-call) rather than sent by the replica: such a call's fate is
    /// unknown, and the final ledgers judge it (I3, I5). A status the replica sent
    /// carries no source error.
    fn made_by_client(status: &tonic::Status) -> bool {
        std::error::Error::source(status).is_some()
            || (status.code() == tonic::Code::Unavailable && status.message().contains("transport"))
    }

    /// `None` when `call` was refused as unauthenticated (try the next call).
    fn judge(call: &str, r: Result<(), tonic::Status>) -> Option<Self> {
        match r {
            Ok(()) => Some(Self::Served(format!("{call} answered OK"))),
            Err(s) if s.code() == tonic::Code::Unauthenticated => None,
            Err(s) if Self::made_by_client(&s) => Some(Self::Unreachable(s.to_string())),
            Err(s) => Some(Self::Served(format!("{call} answered {s}"))),
        }
    }
}

impl Workload {
    /// One hostile probe: the next in turn.
    pub(crate) async fn hostile(&self, rng: &mut Rng) {
        // In turn from a random start, so a short drill still runs every probe.
        let turn = self
            .next_probe
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = rng.range(0, PROBES.len() as u64 - 1);
        let probe = PROBES[((start + turn) % PROBES.len() as u64) as usize];
        match probe {
            Probe::Accumulating => self.accumulating().await,
            Probe::Early => self.early(rng).await,
            Probe::Reuse => self.reuse().await,
            Probe::RaftAsClient => self.raft_as_client().await,
            Probe::Odd => self.odd(rng).await,
            Probe::Releasing => self.releasing().await,
            Probe::TimedOut => self.timed_out().await,
        }
    }

    /// A group of `shape` keyed `{tag}-{label}{op}`, its placement invoked in the history:
    /// (the place operation, the request, its first member).
    fn shaped(&self, shape: Shape, label: &str) -> (u64, SubmitGangGroupRequest, String) {
        let op = self.op_id();
        let key = format!("{}-{label}{op}", self.tag);
        let gangs = gangs_of(shape, op);
        let request = request_of(&key, &gangs);
        let member = format!("{}/m-0", gangs[0].name);
        (self.invoke("place", key, gangs, vec![]), request, member)
    }

    async fn releasing(&self) {
        let (place, request, member) = self.shaped(Shape::PairGroup, "releasing");
        let Some(id) = self.submit(place, request).await else {
            return;
        };
        if self.poll(id, |s| s.state == "Placed").await.is_none() {
            self.give_back("cancel", id).await;
            return;
        }
        tokio::join!(
            self.give_back("release", id),
            self.call_on("release_members", id, &member),
            self.call_on("cancel", id, &member),
            self.give_back("release", id),
        );
    }

    async fn timed_out(&self) {
        let (place, mut request, member) = self.shaped(Shape::Unfit, "timeout");
        for g in &mut request.gangs {
            g.wait_time_ms = TIMED_OUT_WAIT_MS;
        }
        let Some(id) = self.submit_unplaced(place, request).await else {
            return;
        };
        if self.poll(id, |s| s.state == "TimedOut").await.is_none() {
            self.give_back("cancel", id).await;
            return;
        }
        for f in ["release_members", "release", "cancel"] {
            self.call_on(f, id, &member).await;
        }
    }

    fn invoke(&self, f: &str, key: String, gangs: Vec<GangShape>, members: Vec<String>) -> u64 {
        let op = self.op_id();
        self.history.record(Event::Invoke {
            op,
            f: f.to_string(),
            key,
            gangs,
            members,
        });
        op
    }

    async fn submit(&self, op: u64, request: SubmitGangGroupRequest) -> Option<u64> {
        let r = self
            .replicas
            .call(|c| {
                let r = request.clone();
                async move { c.submit_once(r).await }
            })
            .await;
        let id = match &r {
            CallResult::Ok(s) => Some(s.id),
            _ => None,
        };
        self.record_result(op, id.unwrap_or_default(), r);
        id
    }

    async fn accumulating(&self) {
        let op0 = self.op_id();
        let key = format!("{}-acc{op0}", self.tag);
        let gang = format!("acc{op0}");
        let shape = GangShape {
            name: format!("{NAMESPACE}/{gang}"),
            min_member: 3,
            members: 3,
            mode: "NonStrict".into(),
            cpu: 1,
            gpu: 0,
            priority: 0,
            required: None,
        };
        let request = SubmitGangGroupRequest {
            queue: String::new(),
            run_limit_seconds: 0,
            idempotency_key: key.clone(),
            name: key.clone(),
            gangs: vec![GangSpec {
                name: gang,
                namespace: NAMESPACE.into(),
                min_member: 3,
                total_number: 3,
                mode: "NonStrict".into(),
                wait_time_ms: 0,
                priority: 0,
                members: vec![
                    MemberSpec {
                        name: "small".into(),
                        count: 2,
                        pod_json: r#"{"requests":{"cpu":"1"}}"#.into(),
                        pods: None,
                    },
                    MemberSpec {
                        name: "huge".into(),
                        count: 1,
                        pod_json: r#"{"requests":{"cpu":"1000"}}"#.into(),
                        pods: None,
                    },
                ],
                topology: None,
            }],
        };
        let op = self.invoke("place", key, vec![shape], vec![]);
        let Some(id) = self.submit_unplaced(op, request).await else {
            return;
        };
        // Wait until it holds its two small members (or give up: faults).
        let Some(status) = self
            .poll(id, |s| s.state == "Queued" && s.placements.len() == 2)
            .await
        else {
            return;
        };
        if let Some(member) = placed_of(&status).into_iter().next().map(|p| p.member) {
            let op = self.invoke(
                "release_members",
                id.to_string(),
                vec![],
                vec![member.clone()],
            );
            let r = self
                .replicas
                .call(|c| {
                    let m = vec![member.clone()];
                    async move { c.release_members(id, m).await }
                })
                .await;
            self.record_result(op, id, r);
        }
        let op = self.invoke("release", id.to_string(), vec![], vec![]);
        let r = self
            .replicas
            .call(|c| async move { c.release(id).await })
            .await;
        self.record_result(op, id, r);
        // Left Queued: the drill's end checks the ledgers before cancelling it.
    }

    /// Submits a group that is not expected to be placed; the result is recorded
    /// as unknown (it waits) with the group's id in the message.
    async fn submit_unplaced(&self, op: u64, request: SubmitGangGroupRequest) -> Option<u64> {
        let r = self
            .replicas
            .call(|c| {
                let r = request.clone();
                async move { c.submit_once(r).await }
            })
            .await;
        match r {
            CallResult::Ok(s) => {
                self.history.record(Event::Unknown {
                    op,
                    error: format!("group {} waits by design ({})", s.id, s.state),
                });
                Some(s.id)
            }
            CallResult::Fail(error) => {
                self.history.record(Event::Fail { op, error });
                None
            }
            CallResult::Unknown(error) => {
                self.history.record(Event::Unknown { op, error });
                None
            }
        }
    }

    /// Polls group `id` until `done` holds, for at most the placement wait.
    async fn poll(
        &self,
        id: u64,
        done: impl Fn(&gangway_proto::v1::GangGroupStatus) -> bool,
    ) -> Option<gangway_proto::v1::GangGroupStatus> {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(crate::workload::PLACE_WAIT_MS);
        while tokio::time::Instant::now() < deadline {
            if let CallResult::Ok(s) = self.replicas.call(|c| async move { c.get(id).await }).await
            {
                if done(&s) {
                    return Some(s);
                }
            }
            tokio::time::sleep(Duration::from_millis(crate::workload::POLL_MS)).await;
        }
        None
    }

    async fn early(&self, rng: &mut Rng) {
        let (place, request, first_member) = self.shaped(Shape::PairGroup, "early");
        let Some(id) = self.submit_unplaced(place, request).await else {
            return;
        };
        let calls = ["release", "cancel", "release_members"];
        let f = rng.pick(&calls).copied().unwrap_or("cancel");
        self.call_on(f, id, &first_member).await;
        let ended = self
            .poll(id, |s| {
                s.state == "Placed" || crate::workload::TERMINAL.contains(&s.state.as_str())
            })
            .await;
        if ended.is_some_and(|s| s.state == "Placed") {
            self.give_back("release", id).await;
            let _ = self
                .poll(id, |s| {
                    crate::workload::TERMINAL.contains(&s.state.as_str())
                })
                .await;
        }
        // Both again on a finished (or abandoned) group.
        self.call_on("release", id, &first_member).await;
        self.call_on("cancel", id, &first_member).await;
    }

    async fn call_on(&self, f: &str, id: u64, member: &str) {
        match f {
            "release_members" => {
                let op = self.invoke(f, id.to_string(), vec![], vec![member.to_string()]);
                let r = self
                    .replicas
                    .call(|c| {
                        let m = vec![member.to_string()];
                        async move { c.release_members(id, m).await }
                    })
                    .await;
                self.record_result(op, id, r);
            }
            other => self.give_back(other, id).await,
        }
    }

    async fn reuse(&self) {
        let op = self.op_id();
        let key = format!("{}-reuse{op}", self.tag);
        let gangs = gangs_of(Shape::Probe, op);
        let request = request_of(&key, &gangs);
        let place = self.invoke("place", key.clone(), gangs.clone(), vec![]);
        let Some(id) = self.submit(place, request.clone()).await else {
            return;
        };
        if self.poll(id, |s| s.state == "Placed").await.is_none() {
            self.give_back("cancel", id).await;
            return;
        }
        // The same body again is the same group. (A group of priority 0 may be
        // preempted meanwhile; then its gang is free again and the twin is accepted,
        // which the checker tells apart by what the release below answers.)
        let again = self.invoke("place", key.clone(), gangs.clone(), vec![]);
        self.submit(again, request.clone()).await;
        // Another body under the key, and the gang under another key: both refused
        // while the group lives.
        let mut other = request.clone();
        other.gangs[0].members[0].pod_json = r#"{"requests":{"cpu":"2"}}"#.into();
        let conflicting = self.invoke(F_PLACE_CONFLICTING, key.clone(), vec![], vec![]);
        self.submit_refused(conflicting, other).await;
        let mut twin = request;
        twin.idempotency_key = format!("{key}-twin");
        twin.name = twin.idempotency_key.clone();
        // The twin's gangs are recorded so the checker finds the group declaring them.
        let duplicate = self.invoke(
            F_PLACE_DUPLICATE_GANG,
            twin.idempotency_key.clone(),
            gangs,
            vec![],
        );
        self.submit_refused(duplicate, twin).await;
        self.give_back("release", id).await;
    }

    /// Sends a request that must be refused; if it is accepted anyway, the group it
    /// made is cancelled (the history already shows the violation).
    async fn submit_refused(&self, op: u64, request: SubmitGangGroupRequest) {
        if let Some(id) = self.submit(op, request).await {
            self.give_back("cancel", id).await;
        }
    }

    async fn raft_as_client(&self) {
        let endpoints = self.replicas.endpoints().to_vec();
        for addr in endpoints {
            for node in 1..=FORGED_NODES_MAX {
                let op = self.invoke(
                    F_RAFT_AS_CLIENT,
                    format!("{addr} node {node}"),
                    vec![],
                    vec![],
                );
                let r = tokio::time::timeout(
                    Duration::from_millis(RAFT_CALL_TIMEOUT_MS),
                    self.forge(&addr, node),
                )
                .await;
                let event = match r {
                    Ok(Forged::Served(what)) => Event::Ok {
                        op,
                        group: 0,
                        state: format!("served: {what}"),
                        placed: vec![],
                    },
                    Ok(Forged::Refused(error)) => Event::Fail { op, error },
                    Ok(Forged::Unreachable(error)) => Event::Unknown { op, error },
                    Err(_) => Event::Unknown {
                        op,
                        error: format!("no answer in {RAFT_CALL_TIMEOUT_MS} ms"),
                    },
                };
                self.history.record(event);
            }
        }
    }

    /// A forged Release (of a member no group has), alone and batched, and a forged vote. Any answer but
    /// Unauthenticated means the transport served a client.
    async fn forge(&self, addr: &str, node: u64) -> Forged {
        let mut raft = match RaftTransportClient::connect(format!("http://{addr}")).await {
            Ok(r) => r,
            Err(e) => return Forged::Unreachable(e.to_string()),
        };
        let envelope = Some(Envelope {
            cluster_id: self.cluster_id.clone(),
            group_id: 1,
            from_node: 99,
            to_node: node,
        });
        let command = serde_json::json!({
            "at_ms": 0,
            "op": {"Release": {"target": {"Members": [format!("{NAMESPACE}/forged/m")]}}}
        });
        let proposed = raft
            .propose(ProposeRequest {
                envelope: envelope.clone(),
                command: command.to_string().into_bytes(),
            })
            .await;
        if let Some(served) = Forged::judge("Propose", proposed.map(|_| ())) {
            return served;
        }
        let batched = raft
            .propose_many(ProposeManyRequest {
                envelope: envelope.clone(),
                commands: vec![command.to_string().into_bytes()],
            })
            .await;
        if let Some(served) = Forged::judge("ProposeMany", batched.map(|_| ())) {
            return served;
        }
        let voted = raft
            .vote(RaftRequest {
                envelope,
                payload: Vec::new(),
            })
            .await;
        Forged::judge("Vote", voted.map(|_| ())).unwrap_or_else(|| {
            Forged::Refused("Propose, ProposeMany and Vote refused as unauthenticated".into())
        })
    }

    async fn odd(&self, rng: &mut Rng) {
        let op = self.op_id();
        let key = format!("{}-odd{op}", self.tag);
        let base = request_of(&key, &gangs_of(Shape::Probe, op));
        let cases: [(&str, fn(&mut SubmitGangGroupRequest)); 9] = [
            ("minMember above the members", |r| r.gangs[0].min_member = 7),
            ("no gangs", |r| r.gangs.clear()),
            ("4 billion members", |r| {
                r.gangs[0].members[0].count = u32::MAX
            }),
            ("pod_json not JSON", |r| {
                r.gangs[0].members[0].pod_json = "{cpu: one".into()
            }),
            ("negative cpu", |r| {
                r.gangs[0].members[0].pod_json = r#"{"requests":{"cpu":"-1"}}"#.into()
            }),
            ("cpu beyond any quantity", |r| {
                r.gangs[0].members[0].pod_json = r#"{"requests":{"cpu":"1e400"}}"#.into()
            }),
            ("namespace not a DNS label", |r| {
                r.gangs[0].namespace = "Not_A/Label".into()
            }),
            ("gang name of 300 characters", |r| {
                r.gangs[0].name = "g".repeat(300)
            }),
            ("mode neither Strict nor NonStrict", |r| {
                r.gangs[0].mode = "Sometimes".into()
            }),
        ];
        // Two in eleven: calls on a group that does not exist instead.
        let pick = rng.range(0, cases.len() as u64 + 1) as usize;
        if let Some((what, mutate)) = cases.get(pick) {
            let mut request = base;
            mutate(&mut request);
            let op = self.invoke(F_ODD, format!("{key}: {what}"), vec![], vec![]);
            self.submit_refused(op, request).await;
            return;
        }
        // Calls on a group that does not exist, and on members no group has.
        let id = u64::MAX - rng.range(0, 1_000);
        let op = self.invoke(
            F_ODD,
            format!("release_members of missing group {id}"),
            vec![],
            vec![],
        );
        let r = self
            .replicas
            .call(|c| async move { c.release_members(id, vec!["chaos/none/m".into()]).await })
            .await;
        self.record_result(op, id, r);
        let op = self.invoke(
            F_ODD,
            format!("release of missing group {id}"),
            vec![],
            vec![],
        );
        let r = self
            .replicas
            .call(|c| async move { c.release(id).await })
            .await;
        self.record_result(op, id, r);
    }
}

#[cfg(test)]
#[path = "hostile_tests.rs"]
mod tests;
