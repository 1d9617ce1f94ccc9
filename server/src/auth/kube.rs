//! The Kubernetes API as gangway's authority for Kubernetes users: TokenReview
//! (authentication.k8s.io/v1) says who a bearer token stands for, SubjectAccessReview
//! (authorization.k8s.io/v1) whether that user's RBAC rules grant a verb on a resource of
//! API group `gangway.dev`. Called through the [`Reviewer`] trait by
//! `auth::access::Access` when gangway runs with `--kube-auth`; a replica builds one
//! [`KubeReviewer`] from its Kubernetes client.
//!
//! It owns two caches, bounded in entries and in age, so that a busy client costs the API
//! server one review per token per minute and one review per question per ten seconds:
//! answers about tokens ([`TOKEN_REVIEW_CACHE_MAX`] entries; authenticated ones for
//! [`TOKEN_REVIEW_TTL_MS`], refused ones for [`TOKEN_REFUSED_TTL_MS`]) and about access
//! ([`ACCESS_REVIEW_CACHE_MAX`] entries; allowed for [`ACCESS_REVIEW_TTL_MS`], denied for
//! [`ACCESS_DENIED_TTL_MS`]). Tokens are kept only as SHA-256 digests and never logged.
//! Every call to the API is bounded by [`REVIEW_TIMEOUT_MS`]; errors are not cached (the
//! next request asks again). Two identical reviews in flight at once may both reach the
//! API: the caches bound the load, they do not deduplicate it.
//!
//! The ServiceAccount gangway runs as needs RBAC `create` on `tokenreviews`
//! (authentication.k8s.io) and `subjectaccessreviews` (authorization.k8s.io), as the
//! `system:auth-delegator` ClusterRole grants.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// `::kube`: the client crate, not gangway's own `crate::kube` module.
use ::kube::api::{Api, PostParams};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use sha2::{Digest, Sha256};

use crate::auth::access::{Ask, KubeUser, ReviewError, Reviewer, API_GROUP};

/// Tokens whose review is remembered at once (entries).
pub const TOKEN_REVIEW_CACHE_MAX: usize = 10_000;
/// How long an authenticated token's user is remembered (ms): how long a revoked or
/// expired token may still be accepted (plus the API server's own 10 s token cache).
pub const TOKEN_REVIEW_TTL_MS: u64 = 60_000;
/// How long a refused token is remembered (ms): short, so a token refused while the API
/// server was catching up (a fresh ServiceAccount) is soon asked about again.
pub const TOKEN_REFUSED_TTL_MS: u64 = 10_000;
/// Access questions whose answer is remembered at once (entries).
pub const ACCESS_REVIEW_CACHE_MAX: usize = 100_000;
/// How long an allowed access is remembered (ms): how long a removed RoleBinding may
/// still grant it.
pub const ACCESS_REVIEW_TTL_MS: u64 = 10_000;
/// How long a denied access is remembered (ms): shorter, so a new RoleBinding takes
/// effect soon.
pub const ACCESS_DENIED_TTL_MS: u64 = 5_000;
/// How long one TokenReview or SubjectAccessReview may take (ms).
pub const REVIEW_TIMEOUT_MS: u64 = 5_000;

/// Where a [`KubeReviewer`] reads the time (a test's clock, or the monotonic one).
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Instant;
}

/// The monotonic clock, [`Instant::now`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// One remembered answer.
#[derive(Debug)]
struct Entry<V> {
    value: V,
    expires: Instant,
    /// Insertion order, unique: the key of this entry in both indexes.
    seq: u64,
}

/// A map whose entries expire, holding at most `max` of them. When full, an insertion
/// first drops the expired entries, then the oldest inserted ones. Pure: the caller
/// passes the time, so tests drive it without sleeping.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    max: usize,
    next_seq: u64,
    entries: HashMap<K, Entry<V>>,
    /// Keys by insertion order (`seq`), for dropping the oldest.
    by_age: BTreeMap<u64, K>,
    /// `(expires, seq)` of every entry, for dropping the expired ones without a scan.
    by_expiry: BTreeSet<(Instant, u64)>,
}

impl<K: Eq + Hash + Clone, V> TtlCache<K, V> {
    /// An empty cache holding at most `max` entries (0: remembers nothing).
    pub fn new(max: usize) -> Self {
        Self {
            max,
            next_seq: 0,
            entries: HashMap::new(),
            by_age: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }

    /// Entries held, expired ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key` if it has not expired at `now` (an expired one is dropped).
    pub fn get(&mut self, key: &K, now: Instant) -> Option<&V> {
        let expired = self.entries.get(key)?.expires <= now;
        if expired {
            self.remove(key);
            return None;
        }
        self.entries.get(key).map(|e| &e.value)
    }

    /// Remembers `value` for `key` until `now + ttl`, replacing an earlier value; makes
    /// room first when full.
    pub fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.max == 0 {
            return;
        }
        self.remove(&key);
        if self.entries.len() >= self.max {
            self.drop_expired(now);
        }
        while self.entries.len() >= self.max {
            match self.by_age.first_key_value() {
                Some((_, oldest)) => {
                    let oldest = oldest.clone();
                    self.remove(&oldest);
                }
                None => break,
            }
        }
        // An Instant that cannot be ttl later (never, in practice) expires at once.
        let expires = now.checked_add(ttl).unwrap_or(now);
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.by_age.insert(seq, key.clone());
        self.by_expiry.insert((expires, seq));
        self.entries.insert(
            key,
            Entry {
                value,
                expires,
                seq,
            },
        );
    }

    /// Drops every entry expired at `now`.
    pub fn drop_expired(&mut self, now: Instant) {
        while let Some(&(expires, seq)) = self.by_expiry.first() {
            if expires > now {
                break;
            }
            match self.by_age.get(&seq).cloned() {
                Some(key) => self.remove(&key),
                // Indexes out of step (never): drop the stray index entry.
                None => {
                    self.by_expiry.remove(&(expires, seq));
                }
            }
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(e) = self.entries.remove(key) {
            self.by_age.remove(&e.seq);
            self.by_expiry.remove(&(e.expires, e.seq));
        }
    }
}

/// A cache key: a SHA-256 digest (of a token, or of a user and a question), so that no
/// token is held in plain text and every entry's key has the same small size.
type Digest32 = [u8; 32];

/// The [`Reviewer`] that asks the Kubernetes API, with bounded caches.
pub struct KubeReviewer {
    token_reviews: Api<TokenReview>,
    access_reviews: Api<SubjectAccessReview>,
    clock: Arc<dyn Clock>,
    timeout: Duration,
    tokens: Mutex<TtlCache<Digest32, Option<KubeUser>>>,
    access: Mutex<TtlCache<Digest32, bool>>,
}

impl std::fmt::Debug for KubeReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReviewer")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KubeReviewer {
    /// A reviewer asking through `client` (whose identity needs `create` on
    /// tokenreviews and subjectaccessreviews), on the monotonic clock.
    pub fn new(client: ::kube::Client) -> Self {
        Self::with_clock(client, Arc::new(MonotonicClock))
    }

    /// A reviewer on `clock` (tests).
    pub fn with_clock(client: ::kube::Client, clock: Arc<dyn Clock>) -> Self {
        Self {
            token_reviews: Api::all(client.clone()),
            access_reviews: Api::all(client),
            clock,
            timeout: Duration::from_millis(REVIEW_TIMEOUT_MS),
            tokens: Mutex::new(TtlCache::new(TOKEN_REVIEW_CACHE_MAX)),
            access: Mutex::new(TtlCache::new(ACCESS_REVIEW_CACHE_MAX)),
        }
    }

    async fn ask_token_review(&self, token: &str) -> Result<Option<KubeUser>, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                // No audiences: the API server's own, so tokens minted for it are accepted.
                audiences: None,
                token: Some(token.to_string()),
            },
            ..TokenReview::default()
        };
        let params = PostParams::default();
        let call = self.token_reviews.create(&params, &review);
        let what = "TokenReview (authentication.k8s.io/v1)";
        let answer = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => {
                return Err(ReviewError(format!(
                    "{what} did not answer within {} ms",
                    self.timeout.as_millis()
                )))
            }
            Ok(Err(e)) => return Err(ReviewError(format!("{what} failed: {}", describe(&e)))),
            Ok(Ok(answer)) => answer,
        };
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            if let Some(reason) = status.error.filter(|r| !r.is_empty()) {
                tracing::debug!(%reason, "the Kubernetes API did not authenticate a bearer token");
            }
            return Ok(None);
        }
        let user = status.user.unwrap_or_default();
        // A user without a name could own nothing and be granted nothing: not a user.
        let Some(name) = user.username.filter(|n| !n.is_empty()) else {
            tracing::debug!("the Kubernetes API authenticated a bearer token but named no user");
            return Ok(None);
        };
        Ok(Some(KubeUser {
            name,
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
            owner: String::new(),
        }))
    }

    async fn ask_access_review(&self, user: &KubeUser, ask: &Ask) -> Result<bool, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(API_GROUP.to_string()),
                    resource: Some(ask.resource.name().to_string()),
                    verb: Some(ask.verb.name().to_string()),
                    namespace: ask.namespace.clone(),
                    name: ask.name.clone(),
                    subresource: ask.subresource.map(str::to_string),
                    ..ResourceAttributes::default()
                }),
                non_resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let params = PostParams::default();
        let call = self.access_reviews.create(&params, &review);
        let what = "SubjectAccessReview (authorization.k8s.io/v1)";
        let answer = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => {
                return Err(ReviewError(format!(
                    "{what} for {} did not answer within {} ms",
                    user.name,
                    self.timeout.as_millis()
                )))
            }
            Ok(Err(e)) => return Err(ReviewError(format!("{what} for {} failed: {e}", user.name))),
            Ok(Ok(answer)) => answer,
        };
        // Denied and no opinion (allowed false, with or without an evaluation error)
        // both refuse: only an explicit allow grants.
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// A kube error in one line: the API's code, reason and message (a 403 names the RBAC
/// rule gangway's ServiceAccount lacks), else the error itself. Neither carries the
/// request body, so no token reaches a message.
fn describe(e: &::kube::Error) -> String {
    match e {
        ::kube::Error::Api(status) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        other => other.to_string(),
    }
}

/// The token's cache key.
fn token_key(token: &str) -> Digest32 {
    Sha256::digest(token.as_bytes()).into()
}

/// The cache key of `user` asking `ask`: every field the review sends, each length-
/// prefixed so that no two different questions encode alike.
fn access_key(user: &KubeUser, ask: &Ask) -> Digest32 {
    fn field(h: &mut Sha256, bytes: &[u8]) {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    fn optional(h: &mut Sha256, value: Option<&str>) {
        match value {
            None => h.update([0u8]),
            Some(v) => {
                h.update([1u8]);
                field(h, v.as_bytes());
            }
        }
    }
    let mut h = Sha256::new();
    field(&mut h, user.name.as_bytes());
    field(&mut h, user.uid.as_bytes());
    h.update((user.groups.len() as u64).to_le_bytes());
    for g in &user.groups {
        field(&mut h, g.as_bytes());
    }
    h.update((user.extra.len() as u64).to_le_bytes());
    for (k, values) in &user.extra {
        field(&mut h, k.as_bytes());
        h.update((values.len() as u64).to_le_bytes());
        for v in values {
            field(&mut h, v.as_bytes());
        }
    }
    field(&mut h, ask.verb.name().as_bytes());
    field(&mut h, ask.resource.name().as_bytes());
    optional(&mut h, ask.namespace.as_deref());
    optional(&mut h, ask.name.as_deref());
    optional(&mut h, ask.subresource);
    h.finalize().into()
}

/// Runs `f` on the cache behind `cache`; `None` if a panic poisoned it (the caches only
/// save calls: without one, every review goes to the API).
fn with_cache<C, R>(cache: &Mutex<C>, f: impl FnOnce(&mut C) -> R) -> Option<R> {
    cache.lock().ok().map(|mut c| f(&mut c))
}

#[tonic::async_trait]
impl Reviewer for KubeReviewer {
    async fn review_token(&self, token: &str) -> Result<Option<KubeUser>, ReviewError> {
        let key = token_key(token);
        let now = self.clock.now();
        if let Some(Some(known)) = with_cache(&self.tokens, |c| c.get(&key, now).cloned()) {
            return Ok(known);
        }
        let user = self.ask_token_review(token).await?;
        let ttl = match user {
            Some(_) => TOKEN_REVIEW_TTL_MS,
            None => TOKEN_REFUSED_TTL_MS,
        };
        let now = self.clock.now();
        with_cache(&self.tokens, |c| {
            c.insert(key, user.clone(), Duration::from_millis(ttl), now)
        });
        Ok(user)
    }

    async fn allowed(&self, user: &KubeUser, ask: &Ask) -> Result<bool, ReviewError> {
        let key = access_key(user, ask);
        let now = self.clock.now();
        if let Some(Some(known)) = with_cache(&self.access, |c| c.get(&key, now).copied()) {
            return Ok(known);
        }
        let allowed = self.ask_access_review(user, ask).await?;
        let ttl = match allowed {
            true => ACCESS_REVIEW_TTL_MS,
            false => ACCESS_DENIED_TTL_MS,
        };
        let now = self.clock.now();
        with_cache(&self.access, |c| {
            c.insert(key, allowed, Duration::from_millis(ttl), now)
        });
        Ok(allowed)
    }
}

#[cfg(test)]
#[path = "kube_tests.rs"]
mod tests;
