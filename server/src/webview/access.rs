//! Who may see the web view: a caller the replica's authorities let read the whole
//! cluster (the `viewer` role or more: `get cluster` and `list nodes`). A browser signs
//! in once with a bearer token and gets a session cookie, a random id that is not the
//! token, bounded in number and lifetime, `Secure` when the request came over TLS (a
//! TLS-terminating proxy says so with `X-Forwarded-Proto: https`); scripts may send
//! `Authorization: Bearer` on every request instead. Failed sign-ins are limited per
//! client address. Every request of a session asks again whether its caller may read the
//! cluster (a token withdrawn from its file, a role taken away, or RBAC changed ends it;
//! a Kubernetes token that expires or is revoked is noticed only when the session
//! ends). A replica that requires no credentials shows the view to anyone; one whose
//! callers can only be recognised by a client certificate (mutual TLS without tokens)
//! shows it to no one, since the HTTP port sees no certificate; one whose gRPC port
//! speaks TLS takes tokens only over TLS (a proxy), unless its operator allows them on
//! the plaintext port (`--ui-plaintext-tokens`, for a trusted network).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::auth::{Access, Ask, Credentials, Principal, Resource, Verb};

/// Sessions kept at once on one replica (the oldest go first).
pub const UI_SESSIONS_MAX: usize = 10_000;
/// How long a session lasts, in ms.
pub const UI_SESSION_TTL_MS: u64 = 3_600_000;
/// Failed sign-ins one client address may make per window.
pub const UI_SIGN_IN_FAILURES_MAX: u32 = 5;
/// The window failed sign-ins are counted in, in ms.
pub const UI_SIGN_IN_WINDOW_MS: u64 = 60_000;
/// Client addresses whose failures are remembered at once.
pub const UI_SIGN_IN_CLIENTS_MAX: usize = 10_000;
/// Random bytes of a session id (hex-encoded in the cookie).
pub const UI_SESSION_ID_BYTES: usize = 32;

/// Why a caller does not get the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No credential, or one not accepted (sign in).
    Unauthenticated(String),
    /// Known, but not allowed to read the cluster.
    Forbidden(String),
    /// Too many failed sign-ins from this address (retry later).
    TooMany,
    /// The Kubernetes API could not be asked (retry later).
    Unavailable(String),
}

struct Session {
    who: Principal,
    /// SHA-256 of the token it signed in with (policy and tokens-file callers are looked
    /// up by it again each request).
    token: [u8; 32],
    expires: Instant,
}

/// The web view's access: authorities, sessions and the sign-in limiter.
#[derive(Clone)]
pub struct UiAccess {
    credentials: Arc<Credentials>,
    access: Access,
    /// Tokens only over TLS (the gRPC port speaks TLS and the operator did not allow
    /// them on the plaintext HTTP port).
    tokens_over_tls_only: bool,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
    failures: Arc<Mutex<BTreeMap<IpAddr, (Instant, u32)>>>,
}

impl UiAccess {
    /// Access through the replica's own credentials and authorities.
    pub fn new(credentials: Arc<Credentials>, access: Access) -> Self {
        Self {
            credentials,
            access,
            tokens_over_tls_only: false,
            sessions: Arc::default(),
            failures: Arc::default(),
        }
    }

    /// Takes tokens only from requests that came over TLS when `on`.
    pub fn tokens_over_tls_only(mut self, on: bool) -> Self {
        self.tokens_over_tls_only = on;
        self
    }

    /// Refuses a token sent over plaintext where tokens travel over TLS only.
    pub fn check_transport(&self, over_tls: bool) -> Result<(), Refusal> {
        if self.tokens_over_tls_only && !over_tls {
            return Err(Refusal::Forbidden(
                "this cluster speaks TLS: send tokens to the web view over TLS only (a \
                 TLS-terminating proxy that sets X-Forwarded-Proto: https), or start gangway \
                 with --ui-plaintext-tokens on a trusted network"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether anyone may see the view without signing in.
    pub fn is_open(&self) -> bool {
        self.credentials.is_open()
    }

    /// Whether a token can sign in at all on this replica.
    fn takes_tokens(&self) -> bool {
        self.credentials.tokens.is_some()
            || self.credentials.policy.is_some()
            || self.credentials.kube_review
    }

    /// The principal behind `token` if it may read the cluster.
    pub async fn viewer(&self, token: &str) -> Result<Principal, Refusal> {
        if !self.takes_tokens() {
            return Err(Refusal::Forbidden(
                "this replica recognises callers by client certificate only, which the web view \
                 cannot see; give it --auth-tokens-file or --policy-file"
                    .into(),
            ));
        }
        let caller = self
            .credentials
            .token_caller(token)
            .map_err(|s| Refusal::Unauthenticated(s.message().to_string()))?;
        let who = self
            .access
            .resolve(caller)
            .await
            .map_err(|s| match s.code() {
                tonic::Code::Unavailable => Refusal::Unavailable(s.message().to_string()),
                _ => Refusal::Unauthenticated(s.message().to_string()),
            })?;
        self.may_view(&who).await?;
        Ok(who)
    }

    /// Whether `who` may read the cluster.
    async fn may_view(&self, who: &Principal) -> Result<(), Refusal> {
        for ask in [
            Ask::of(Verb::Get, Resource::Cluster),
            Ask::of(Verb::List, Resource::Nodes),
        ] {
            match self.access.allows(who, &ask).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Refusal::Forbidden(format!(
                        "{} may not read the cluster (the viewer role, or get cluster and list nodes in API group gangway.dev)",
                        who.name()
                    )))
                }
                                Err(s) => return Err(Refusal::Unavailable(s.message().to_string())),
            }
        }
        Ok(())
    }

    /// Signs in from `client` with `token`: a new session id, or why not.
    pub async fn sign_in(
        &self,
        client: Option<IpAddr>,
        token: &str,
        now: Instant,
    ) -> Result<String, Refusal> {
        if self.blocked(client, now) {
            return Err(Refusal::TooMany);
        }
        let who = match self.viewer(token).await {
            Ok(who) => who,
            Err(refusal) => {
                if matches!(refusal, Refusal::Unauthenticated(_)) {
                    self.failed(client, now);
                }
                return Err(refusal);
            }
        };
        let id = random_id().map_err(|e| Refusal::Unavailable(e.to_string()))?;
        let mut sessions = self
            .sessions
            .lock()
            .map_err(|_| Refusal::Unavailable("sessions poisoned".into()))?;
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= UI_SESSIONS_MAX {
            if let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            id.clone(),
            Session {
                who,
                token: crate::auth::policy::token_digest(token),
                expires: now + Duration::from_millis(UI_SESSION_TTL_MS),
            },
        );
        Ok(id)
    }

    /// Whether session `id` is live and its caller may still read the cluster: the name
    /// signed in, or why not.
    pub async fn session(&self, id: &str, now: Instant) -> Result<String, Refusal> {
        let ended = || Refusal::Unauthenticated("the session ended: sign in again".into());
        let (who, token) = {
            let sessions = self.sessions.lock().map_err(|_| ended())?;
            let s = sessions
                .get(id)
                .filter(|s| s.expires > now)
                .ok_or_else(ended)?;
            (s.who.clone(), s.token)
        };
        let who = match who {
            // Looked up again: the policy or the tokens file may have changed.
            Principal::Policy(_) => {
                Principal::Policy(self.credentials.identity_by_digest(&token).ok_or_else(|| {
                    Refusal::Unauthenticated("the token was withdrawn: sign in again".into())
                })?)
            }
            other => other,
        };
        self.may_view(&who).await?;
        Ok(who.name().to_string())
    }

    /// Ends session `id`.
    pub fn sign_out(&self, id: &str) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.remove(id);
        }
    }

    fn blocked(&self, client: Option<IpAddr>, now: Instant) -> bool {
        let Some(ip) = client else {
            return false;
        };
        let Ok(failures) = self.failures.lock() else {
            return true;
        };
        failures.get(&ip).is_some_and(|(since, n)| {
            now.saturating_duration_since(*since) < Duration::from_millis(UI_SIGN_IN_WINDOW_MS)
                && *n >= UI_SIGN_IN_FAILURES_MAX
        })
    }

    fn failed(&self, client: Option<IpAddr>, now: Instant) {
        let Some(ip) = client else {
            return;
        };
        let Ok(mut failures) = self.failures.lock() else {
            return;
        };
        let window = Duration::from_millis(UI_SIGN_IN_WINDOW_MS);
        failures.retain(|_, (since, _)| now.saturating_duration_since(*since) < window);
        if failures.len() >= UI_SIGN_IN_CLIENTS_MAX && !failures.contains_key(&ip) {
            if let Some(oldest) = failures
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| *k)
            {
                failures.remove(&oldest);
            }
        }
        let entry = failures.entry(ip).or_insert((now, 0));
        entry.1 += 1;
    }
}

fn random_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; UI_SESSION_ID_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
