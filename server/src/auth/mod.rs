//! Who may do what (docs/ARCHITECTURE.md §12). Every caller of the gRPC port is a
//! replica (a peer proof), an identity of the access policy (a token or a client
//! certificate), an administrator of the tokens file, a Kubernetes user (a
//! ServiceAccount token the Kubernetes API reviews), or, on a replica that requires no
//! credentials, anyone. `gate` authenticates at the edge, before a request body is read;
//! `access` authorizes per RPC, and the services apply its object rules; `policy` is the
//! policy file; `kube` asks the Kubernetes API (TokenReview, SubjectAccessReview);
//! `limits` bounds what one identity may hold at once.

pub mod access;
pub mod gate;
pub mod kube;
pub mod limits;
pub mod policy;

pub use access::{Access, Admitted, Ask, Principal, Resource, Rpc, Verb};
pub use gate::{Caller, ClientGate, Credentials, PeerGate, PEER_ORGANIZATION};
pub use policy::{Identity, PolicyFile, Role};
