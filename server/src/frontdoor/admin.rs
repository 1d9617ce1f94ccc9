//! The Admin service as clients and peers reach it: the Raft host's own service
//! (status, membership, leadership, balancing, compaction) behind authorization.
//! Every call is the `cluster` resource: `get` for status (any viewer), `update` for
//! the rest (administrators, and peers forwarding what an administrator's replica
//! already authorized). State hashes are `get cluster/statehash`: administrators only,
//! and computed at most every `STATE_HASH_INTERVAL_MS` per replica for callers with an
//! identity (each serializes the whole state).

use std::time::Instant;

use gangway_proto::admin::admin_server::{Admin, AdminServer};
use gangway_proto::admin::{
    AddLearnerRequest, BalanceReply, BalanceRequest, ChangeMembershipRequest, CompactReply,
    CompactRequest, MembershipReply, StatusReply, StatusRequest, TransferLeaderReply,
    TransferLeaderRequest,
};
use gangway_raft::{AdminService, RaftHost};
use tonic::{Request, Response, Status};

use crate::auth::access::{self, Ask, Principal};
use crate::auth::limits::HashRate;
use crate::auth::Access;

/// The authorizing Admin service of one replica.
pub struct AdminFront {
    inner: AdminService,
    access: Access,
    hashes: HashRate,
}

impl AdminFront {
    /// The Admin service of `host`, authorized by `access`.
    pub fn new(host: &RaftHost, access: Access) -> AdminServer<Self> {
        AdminServer::new(Self {
            inner: host.admin(),
            access,
            hashes: HashRate::default(),
        })
    }
}

#[tonic::async_trait]
impl Admin for AdminFront {
    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusReply>, Status> {
        let admitted = self.access.begin(&request, access::STATUS).await?;
        if request.get_ref().include_state_hash {
            let who = &admitted.principal;
            let ask = Ask {
                subresource: Some("statehash"),
                ..Ask::of(access::STATE_HASHES.verb, access::STATE_HASHES.resource)
            };
            self.access.check(who, &ask).await?;
            if !matches!(who, Principal::Open | Principal::Peer) {
                self.hashes.take(Instant::now())?;
            }
        }
        self.inner.status(request).await
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        self.access.begin(&request, access::ADD_LEARNER).await?;
        self.inner.add_learner(request).await
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        self.access
            .begin(&request, access::CHANGE_MEMBERSHIP)
            .await?;
        self.inner.change_membership(request).await
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderReply>, Status> {
        self.access.begin(&request, access::TRANSFER_LEADER).await?;
        self.inner.transfer_leader(request).await
    }

    async fn balance(
        &self,
        request: Request<BalanceRequest>,
    ) -> Result<Response<BalanceReply>, Status> {
        self.access.begin(&request, access::BALANCE).await?;
        self.inner.balance(request).await
    }

    async fn compact(
        &self,
        request: Request<CompactRequest>,
    ) -> Result<Response<CompactReply>, Status> {
        self.access.begin(&request, access::COMPACT).await?;
        self.inner.compact(request).await
    }
}
