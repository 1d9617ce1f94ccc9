//! The Queues admin service: create, change, delete and list queues.
//!
//! Owns the conversion between the API's queues (Kubernetes quantities keyed by
//! resource name) and the model's [`QueueSpec`]; input is validated here (errors name
//! the field) and again by the meta group, which keeps the queues and their usage and
//! answers every read linearizably. Served by every replica; called by `gangctl queues`
//! and by batch frameworks. Changing a queue is `update`/`delete queues`
//! (administrators); a tenant's listing shows the queues it may use.

use std::collections::BTreeMap;

use gangway_proto::admin::queues_server::{Queues, QueuesServer};
use gangway_proto::admin::{
    DeleteQueueReply, DeleteQueueRequest, ListQueuesReply, ListQueuesRequest, PutQueueRequest,
    QueueSpec as ApiQueueSpec, QueueStatus as ApiQueueStatus,
};
use tonic::{Request, Response, Status};

use crate::replicated::Groups;
use gangway_core::ledger::meta::{MetaCommand, MetaQuery, MetaReply, QueueStatus, RejectionKind};
use gangway_core::model::queue::{Limits, QUEUE_WEIGHT_DEFAULT};
use gangway_core::model::{FieldPath, QueueSpec};

/// The Queues gRPC service over one replica's groups.
pub struct QueuesService {
    groups: Groups,
    access: crate::auth::Access,
}

impl QueuesService {
    /// A service over `groups`, authorizing with `access`.
    pub fn new(groups: Groups, access: crate::auth::Access) -> QueuesServer<Self> {
        QueuesServer::new(Self { groups, access })
    }

    /// Whether `who` sees queue `q` in a listing: readers of every queue do; a tenant
    /// the queues it may use (a grant of a queue covers those under it).
    async fn visible(
        &self,
        who: &crate::auth::Principal,
        q: &QueueStatus,
        all: &[QueueStatus],
    ) -> Result<bool, Status> {
        let every = crate::auth::Ask::of(crate::auth::Verb::Get, crate::auth::Resource::Queues);
        if who.is_admin()
            || who
                .identity()
                .is_some_and(|i| i.has(crate::auth::Role::Viewer))
            || matches!(who, crate::auth::Principal::Kube(_))
                && self.access.allows(who, &every).await?
        {
            return Ok(true);
        }
        let parents: BTreeMap<&str, &str> = all
            .iter()
            .map(|s| (s.spec.name.as_str(), s.spec.parent.as_str()))
            .collect();
        let mut chain = Vec::new();
        let mut next = parents.get(q.spec.name.as_str()).copied().unwrap_or("");
        while !next.is_empty() && chain.len() < parents.len() {
            chain.push(next.to_string());
            next = parents.get(next).copied().unwrap_or("");
        }
        self.access.may_use_queue(who, &q.spec.name, &chain).await
    }

    async fn meta(&self, cmd: MetaCommand) -> Result<MetaReply, Status> {
        self.groups.meta(&cmd).await.map_err(|e| e.to_status())
    }
}

/// Reads an API queue into the model's, naming the field at fault.
pub fn queue_spec(api: &ApiQueueSpec) -> Result<QueueSpec, Status> {
    let invalid = |e: gangway_core::model::ValidationError| Status::invalid_argument(e.to_string());
    let spec = QueueSpec {
        name: api.name.clone(),
        parent: api.parent.clone(),
        weight: if api.weight == 0 {
            QUEUE_WEIGHT_DEFAULT
        } else {
            api.weight
        },
        min: limits(&FieldPath::new("queue.min"), &api.min).map_err(invalid)?,
        max: limits(&FieldPath::new("queue.max"), &api.max).map_err(invalid)?,
        lend: limits(&FieldPath::new("queue.lend"), &api.lend).map_err(invalid)?,
        managed_by: String::new(),
        namespaces: api.namespaces.clone(),
    };
    spec.validate(&FieldPath::new("queue")).map_err(invalid)?;
    Ok(spec)
}

fn limits(
    path: &FieldPath,
    map: &std::collections::HashMap<String, String>,
) -> Result<Limits, gangway_core::model::ValidationError> {
    let sorted: BTreeMap<String, String> =
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    Limits::from_quantities(path, &sorted)
}

fn refusal(reason: String, kind: RejectionKind) -> Status {
    match kind {
        RejectionKind::NotFound => Status::not_found(reason),
        RejectionKind::Conflict => Status::failed_precondition(reason),
        RejectionKind::Refused | RejectionKind::NoRoom => Status::invalid_argument(reason),
        RejectionKind::Busy => Status::unavailable(reason),
        RejectionKind::Exhausted => Status::resource_exhausted(reason),
    }
}

#[tonic::async_trait]
impl Queues for QueuesService {
    async fn put_queue(
        &self,
        request: Request<PutQueueRequest>,
    ) -> Result<Response<ApiQueueStatus>, Status> {
        self.access
            .begin(&request, crate::auth::access::PUT_QUEUE)
            .await?;
        let Some(api) = request.into_inner().queue else {
            return Err(Status::invalid_argument("queue: required"));
        };
        let queue = queue_spec(&api)?;
        match self.meta(MetaCommand::PutQueue { queue }).await? {
            MetaReply::Queues { queues } => match queues.first() {
                Some(q) => Ok(Response::new(crate::convert::queue_status(q))),
                None => Err(Status::internal("the queue was stored but not read back")),
            },
            MetaReply::Rejected { reason, kind } => Err(refusal(reason, kind)),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    async fn delete_queue(
        &self,
        request: Request<DeleteQueueRequest>,
    ) -> Result<Response<DeleteQueueReply>, Status> {
        self.access
            .begin(&request, crate::auth::access::DELETE_QUEUE)
            .await?;
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(Status::invalid_argument("name: required"));
        }
        let cmd = MetaCommand::DeleteQueue {
            name,
            managed_by: String::new(),
        };
        match self.meta(cmd).await? {
            MetaReply::Queues { .. } => Ok(Response::new(DeleteQueueReply {})),
            MetaReply::Rejected { reason, kind } => Err(refusal(reason, kind)),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    async fn list_queues(
        &self,
        request: Request<ListQueuesRequest>,
    ) -> Result<Response<ListQueuesReply>, Status> {
        let admitted = self
            .access
            .begin(&request, crate::auth::access::LIST_QUEUES)
            .await?;
        let who = &admitted.principal;
        match self
            .groups
            .meta_query(&MetaQuery::Queues)
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::Queues { queues } => {
                let capacity = match self.groups.meta_query(&MetaQuery::Capacity).await {
                    Ok(MetaReply::Capacity {
                        capacity: Some(capacity),
                    }) => crate::convert::quantities_of(&capacity),
                    _ => Default::default(),
                };
                let fair_share_half_life_ms =
                    match self.groups.meta_query(&MetaQuery::UsageHistory).await {
                        Ok(MetaReply::UsageHistory { half_life_ms, .. }) => half_life_ms,
                        _ => 0,
                    };
                let mut shown = Vec::with_capacity(queues.len());
                for q in &queues {
                    if self.visible(who, q, &queues).await? {
                        shown.push(crate::convert::queue_status(q));
                    }
                }
                Ok(Response::new(ListQueuesReply {
                    queues: shown,
                    capacity,
                    fair_share_half_life_ms,
                }))
            }
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }
}

#[cfg(test)]
#[path = "queues_tests.rs"]
mod tests;
