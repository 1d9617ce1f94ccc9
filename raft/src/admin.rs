//! The gRPC cluster-administration service: status, membership changes,
//! leadership transfer and balancing, compaction. Membership and transfer
//! requests are forwarded to the group's leader by the host.

use std::collections::BTreeSet;

use gangway_proto::admin::admin_server::{Admin, AdminServer};
use gangway_proto::admin::{
    AddLearnerRequest, BalanceReply, BalanceRequest, ChangeMembershipRequest, CompactReply,
    CompactRequest, Member, MembershipReply, StatusReply, StatusRequest, TransferLeaderReply,
    TransferLeaderRequest,
};
use tonic::{Request, Response, Status};

use crate::host::RaftHost;

/// The admin service of a host.
pub struct AdminService {
    host: RaftHost,
}

impl RaftHost {
    /// The tonic service operators and `gangctl cluster` use.
    pub fn admin_service(&self) -> AdminServer<AdminService> {
        AdminServer::new(self.admin())
    }

    /// The admin service's implementation, for a caller that wraps it (authorization).
    pub fn admin(&self) -> AdminService {
        AdminService { host: self.clone() }
    }

    /// This replica's status reply.
    pub fn status_reply(&self, with_hash: bool) -> StatusReply {
        StatusReply {
            cluster_id: self.cluster_id().to_string(),
            node_id: self.node_id(),
            addr: self.advertise_addr().to_string(),
            groups: self.status(with_hash),
            members: self
                .members()
                .into_iter()
                .map(|(node_id, addr)| Member { node_id, addr })
                .collect(),
            members_seen: self.members_seen().into_iter().collect(),
            started_groups: u32::try_from(self.shared.cfg.groups.len()).unwrap_or(u32::MAX),
        }
    }
}

fn selected(host: &RaftHost, group: Option<u64>) -> Vec<gangway_proto::admin::GroupStatus> {
    host.status(false)
        .into_iter()
        .filter(|g| group.is_none_or(|id| id == g.group_id))
        .collect()
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusReply>, Status> {
        let with_hash = request.into_inner().include_state_hash;
        Ok(Response::new(self.host.status_reply(with_hash)))
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        let req = request.into_inner();
        if req.node_id == 0 {
            return Err(Status::invalid_argument("node_id: must be >= 1"));
        }
        self.host
            .add_learner(req.group_id, req.node_id, &req.addr)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(MembershipReply {
            groups: selected(&self.host, req.group_id),
        }))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        let req = request.into_inner();
        let voters: BTreeSet<u64> = req.voters.iter().copied().collect();
        if voters.contains(&0) {
            return Err(Status::invalid_argument("voters: node ids must be >= 1"));
        }
        self.host
            .change_membership(req.group_id, voters)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(MembershipReply {
            groups: selected(&self.host, req.group_id),
        }))
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderReply>, Status> {
        let req = request.into_inner();
        let leader = self
            .host
            .transfer_leader(req.group_id, req.to_node)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(TransferLeaderReply { leader }))
    }

    async fn balance(
        &self,
        _request: Request<BalanceRequest>,
    ) -> Result<Response<BalanceReply>, Status> {
        Ok(Response::new(
            self.host.balance().await.map_err(|e| e.to_status())?,
        ))
    }

    async fn compact(
        &self,
        request: Request<CompactRequest>,
    ) -> Result<Response<CompactReply>, Status> {
        let group = request.into_inner().group_id;
        self.host.compact(group).await.map_err(|e| e.to_status())?;
        Ok(Response::new(CompactReply {
            groups: selected(&self.host, group),
        }))
    }
}
