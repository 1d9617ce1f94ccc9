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
mod tests {
    use super::*;
    use crate::auth::access::{Resource, Verb};
    use serde_json::{json, Value};
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU64, Ordering};

    const MS: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn entries_expire_at_their_ttl() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(4);
        c.insert("a", 1, 100 * MS, t0);
        c.insert("b", 2, 300 * MS, t0);
        assert_eq!(c.get(&"a", t0 + 99 * MS), Some(&1));
        assert_eq!(
            c.get(&"a", t0 + 100 * MS),
            None,
            "expired at exactly its TTL"
        );
        assert_eq!(c.len(), 1, "the expired entry was dropped on read");
        assert_eq!(c.get(&"b", t0 + 299 * MS), Some(&2));
        assert_eq!(c.get(&"missing", t0), None);
    }

    #[test]
    fn insert_replaces_value_and_ttl() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(2);
        c.insert("a", 1, 100 * MS, t0);
        c.insert("a", 2, 500 * MS, t0 + 50 * MS);
        assert_eq!(c.len(), 1);
        assert_eq!(c.get(&"a", t0 + 400 * MS), Some(&2));
        assert_eq!(c.get(&"a", t0 + 550 * MS), None);
        assert!(c.is_empty());
    }

    #[test]
    fn a_full_cache_drops_expired_entries_before_the_oldest() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(3);
        c.insert("old-long", 1, 1_000 * MS, t0);
        c.insert("mid-short", 2, 10 * MS, t0 + MS);
        c.insert("new-long", 3, 1_000 * MS, t0 + 2 * MS);
        // Full; "mid-short" has expired: it goes, the oldest stays.
        c.insert("d", 4, 1_000 * MS, t0 + 20 * MS);
        assert_eq!(c.len(), 3);
        let now = t0 + 21 * MS;
        assert_eq!(c.get(&"old-long", now), Some(&1));
        assert_eq!(c.get(&"mid-short", now), None);
        assert_eq!(c.get(&"new-long", now), Some(&3));
        assert_eq!(c.get(&"d", now), Some(&4));
        // Full, nothing expired: the oldest inserted goes, then the next oldest.
        c.insert("e", 5, 1_000 * MS, now);
        assert_eq!(c.get(&"old-long", now), None);
        c.insert("f", 6, 1_000 * MS, now);
        assert_eq!(c.get(&"new-long", now), None);
        assert_eq!(c.len(), 3);
        for (k, v) in [("d", 4), ("e", 5), ("f", 6)] {
            assert_eq!(c.get(&k, now), Some(&v));
        }
    }

    #[test]
    fn a_rewritten_entry_is_young_again() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(2);
        c.insert("a", 1, 1_000 * MS, t0);
        c.insert("b", 2, 1_000 * MS, t0);
        c.insert("a", 3, 1_000 * MS, t0);
        c.insert("c", 4, 1_000 * MS, t0);
        assert_eq!(c.get(&"b", t0), None, "b became the oldest");
        assert_eq!(c.get(&"a", t0), Some(&3));
        assert_eq!(c.get(&"c", t0), Some(&4));
    }

    #[test]
    fn the_bound_holds_under_many_inserts() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(100);
        for i in 0..10_000u64 {
            // Mixed TTLs, some already expired by the time the cache fills.
            c.insert(i, i, ms(i % 7 + 1), t0 + ms(i / 10));
            assert!(c.len() <= 100);
            assert_eq!(c.by_age.len(), c.len());
            assert_eq!(c.by_expiry.len(), c.len());
        }
        assert_eq!(c.get(&9_999, t0 + 999 * MS), Some(&9_999));
        let mut zero = TtlCache::new(0);
        zero.insert("a", 1, 1_000 * MS, t0);
        assert!(zero.is_empty());
    }

    #[test]
    fn drop_expired_drops_only_expired() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(10);
        for i in 0..10u64 {
            c.insert(i, (), ms((i + 1) * 10), t0);
        }
        c.drop_expired(t0 + 50 * MS);
        assert_eq!(c.len(), 5);
        assert!(c.get(&4, t0).is_none() && c.get(&5, t0).is_some());
    }

    #[test]
    fn access_keys_tell_every_field_apart() {
        let user = KubeUser {
            name: "alice".into(),
            uid: "u1".into(),
            groups: vec!["g".into()],
            extra: BTreeMap::new(),
            owner: String::new(),
        };
        let ask = Ask::of(Verb::Get, Resource::GangGroups).in_namespace("a");
        let base = access_key(&user, &ask);
        assert_eq!(base, access_key(&user.clone(), &ask.clone()));
        let mut others = vec![
            access_key(
                &user,
                &Ask::of(Verb::List, Resource::GangGroups).in_namespace("a"),
            ),
            access_key(
                &user,
                &Ask::of(Verb::Get, Resource::Queues).in_namespace("a"),
            ),
            access_key(&user, &Ask::of(Verb::Get, Resource::GangGroups)),
            access_key(&user, &Ask::of(Verb::Get, Resource::GangGroups).named("a")),
            access_key(
                &user,
                &Ask {
                    subresource: Some("statehash"),
                    ..ask.clone()
                },
            ),
        ];
        for edit in [
            |u: &mut KubeUser| u.name = "bob".into(),
            |u: &mut KubeUser| u.uid = "u2".into(),
            |u: &mut KubeUser| u.groups.push("h".into()),
            |u: &mut KubeUser| u.groups = vec!["g".into(), String::new()],
            |u: &mut KubeUser| {
                u.extra.insert("k".into(), vec!["v".into()]);
            },
        ] {
            let mut u = user.clone();
            edit(&mut u);
            others.push(access_key(&u, &ask));
        }
        let distinct: BTreeSet<Digest32> = others.iter().copied().collect();
        assert_eq!(distinct.len(), others.len());
        assert!(!distinct.contains(&base));
    }

    /// A clock the test moves.
    struct TestClock {
        start: Instant,
        offset_ms: AtomicU64,
    }

    impl TestClock {
        fn advance(&self, ms: u64) {
            self.offset_ms.fetch_add(ms, Ordering::SeqCst);
        }
    }

    impl Clock for TestClock {
        fn now(&self) -> Instant {
            self.start + Duration::from_millis(self.offset_ms.load(Ordering::SeqCst))
        }
    }

    /// The requests a fake API received: path and JSON body.
    type Seen = Arc<Mutex<Vec<(String, Value)>>>;

    /// A Kubernetes API that answers reviews as `answer` says (HTTP status and body;
    /// `None`: never), recording each request (path, body) it receives.
    fn fake_api(
        answer: impl Fn(&str, &Value) -> Option<(u16, Value)> + Send + Sync + 'static,
    ) -> (::kube::Client, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(answer);
        let log = seen.clone();
        let service = tower::service_fn(move |req: http::Request<::kube::client::Body>| {
            let answer = answer.clone();
            let log = log.clone();
            async move {
                let path = req.uri().path().to_string();
                let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                log.lock().unwrap().push((path.clone(), body.clone()));
                let Some((code, mut reply)) = answer(&path, &body) else {
                    // An API server that never answers.
                    std::future::pending::<()>().await;
                    unreachable!()
                };
                if code < 300 {
                    reply["apiVersion"] = body["apiVersion"].clone();
                    reply["kind"] = body["kind"].clone();
                }
                let response = http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(::kube::client::Body::from(reply.to_string().into_bytes()))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        });
        (::kube::Client::new(service, "default"), seen)
    }

    fn reviewer(client: ::kube::Client) -> (KubeReviewer, Arc<TestClock>) {
        let clock = Arc::new(TestClock {
            start: Instant::now(),
            offset_ms: AtomicU64::new(0),
        });
        (KubeReviewer::with_clock(client, clock.clone()), clock)
    }

    const GOOD: &str = "good-token";

    fn token_answer(path: &str, body: &Value) -> Option<(u16, Value)> {
        assert_eq!(path, "/apis/authentication.k8s.io/v1/tokenreviews");
        let good = body["spec"]["token"] == GOOD;
        Some((
            201,
            json!({
                "metadata": {},
                "spec": body["spec"].clone(),
                "status": if good {
                    json!({"authenticated": true, "user": {
                        "username": "system:serviceaccount:team-a:runner",
                        "uid": "3f1c",
                        "groups": ["system:serviceaccounts", "system:authenticated"],
                        "extra": {"authentication.kubernetes.io/credential-id": ["JTI=1"]}
                    }})
                } else {
                    json!({"authenticated": false, "error": "invalid bearer token"})
                }
            }),
        ))
    }

    #[tokio::test]
    async fn token_reviews_are_asked_once_per_ttl() {
        let (client, seen) = fake_api(token_answer);
        let (r, clock) = reviewer(client);
        let user = r.review_token(GOOD).await.unwrap().unwrap();
        assert_eq!(user.name, "system:serviceaccount:team-a:runner");
        assert_eq!(user.uid, "3f1c");
        assert_eq!(
            user.groups,
            ["system:serviceaccounts", "system:authenticated"]
        );
        assert_eq!(
            user.extra["authentication.kubernetes.io/credential-id"],
            ["JTI=1"]
        );
        assert_eq!(r.review_token("bad").await.unwrap(), None);
        assert_eq!(seen.lock().unwrap().len(), 2);
        assert_eq!(seen.lock().unwrap()[0].1["spec"]["token"], GOOD);

        // Both remembered; the refusal for less time.
        clock.advance(TOKEN_REFUSED_TTL_MS - 1);
        assert!(r.review_token(GOOD).await.unwrap().is_some());
        assert!(r.review_token("bad").await.unwrap().is_none());
        assert_eq!(seen.lock().unwrap().len(), 2);
        clock.advance(1);
        assert!(r.review_token("bad").await.unwrap().is_none());
        assert_eq!(seen.lock().unwrap().len(), 3);
        clock.advance(TOKEN_REVIEW_TTL_MS - TOKEN_REFUSED_TTL_MS);
        assert!(r.review_token(GOOD).await.unwrap().is_some());
        assert_eq!(seen.lock().unwrap().len(), 4);

        // Only digests are held.
        let cache = r.tokens.lock().unwrap();
        assert!(cache.entries.contains_key(&token_key(GOOD)));
        assert_eq!(cache.len(), 2);
    }

    #[tokio::test]
    async fn access_reviews_send_the_user_and_question_and_are_cached() {
        let (client, seen) = fake_api(|path, body| {
            assert_eq!(path, "/apis/authorization.k8s.io/v1/subjectaccessreviews");
            let ns = body["spec"]["resourceAttributes"]["namespace"].clone();
            Some((
                201,
                json!({
                    "metadata": {},
                    "spec": body["spec"].clone(),
                    "status": if ns == "team-a" {
                        json!({"allowed": true})
                    } else {
                        json!({"allowed": false, "reason": "no RBAC rule"})
                    }
                }),
            ))
        });
        let (r, clock) = reviewer(client);
        let user = KubeUser {
            name: "system:serviceaccount:team-a:runner".into(),
            uid: "3f1c".into(),
            groups: vec!["system:authenticated".into()],
            extra: BTreeMap::from([("k".to_string(), vec!["v".to_string()])]),
            owner: String::new(),
        };
        let ask = |ns: &str| Ask::of(Verb::Create, Resource::GangGroups).in_namespace(ns);
        assert!(r.allowed(&user, &ask("team-a")).await.unwrap());
        assert!(!r.allowed(&user, &ask("team-b")).await.unwrap());
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 2);
            assert_eq!(
                seen[0].1["spec"],
                json!({
                    "user": "system:serviceaccount:team-a:runner",
                    "uid": "3f1c",
                    "groups": ["system:authenticated"],
                    "extra": {"k": ["v"]},
                    "resourceAttributes": {
                        "group": "gangway.dev",
                        "resource": "ganggroups",
                        "verb": "create",
                        "namespace": "team-a"
                    }
                })
            );
        }
        let statehash = Ask {
            subresource: Some("statehash"),
            ..Ask::of(Verb::Get, Resource::Cluster).named("x")
        };
        assert!(!r.allowed(&user, &statehash).await.unwrap());
        let sent = seen.lock().unwrap()[2].1["spec"]["resourceAttributes"].clone();
        assert_eq!(sent["subresource"], "statehash");
        assert_eq!(sent["name"], "x");
        assert_eq!(sent["verb"], "get");
        assert_eq!(sent["resource"], "cluster");

        clock.advance(ACCESS_DENIED_TTL_MS - 1);
        assert!(r.allowed(&user, &ask("team-a")).await.unwrap());
        assert!(!r.allowed(&user, &ask("team-b")).await.unwrap());
        assert_eq!(seen.lock().unwrap().len(), 3);
        clock.advance(1);
        assert!(!r.allowed(&user, &ask("team-b")).await.unwrap());
        assert_eq!(
            seen.lock().unwrap().len(),
            4,
            "a denial is asked again sooner"
        );
        clock.advance(ACCESS_REVIEW_TTL_MS - ACCESS_DENIED_TTL_MS);
        assert!(r.allowed(&user, &ask("team-a")).await.unwrap());
        assert_eq!(seen.lock().unwrap().len(), 5);
    }

    #[tokio::test]
    async fn api_errors_and_timeouts_are_review_errors_and_not_cached() {
        let (client, seen) = fake_api(|path, _| {
            // As when gangway's ServiceAccount lacks the RBAC rule; SubjectAccessReviews
            // never answer.
            path.ends_with("tokenreviews").then(|| {
                (
                    403,
                    json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "Forbidden", "code": 403,
                        "message": "tokenreviews.authentication.k8s.io is forbidden: \
                            User \"system:serviceaccount:gangway:gangway\" cannot create \
                            resource \"tokenreviews\""
                    }),
                )
            })
        });
        let (mut r, _clock) = reviewer(client);
        r.timeout = 50 * MS;
        let e = r.review_token(GOOD).await.unwrap_err();
        assert!(
            e.0.contains("TokenReview") && e.0.contains("403 Forbidden: tokenreviews"),
            "{e}"
        );
        assert!(!e.to_string().contains(GOOD), "{e}");
        r.review_token(GOOD).await.unwrap_err();
        assert_eq!(seen.lock().unwrap().len(), 2, "errors are not cached");

        let user = KubeUser {
            name: "u".into(),
            uid: String::new(),
            groups: Vec::new(),
            extra: BTreeMap::new(),
            owner: String::new(),
        };
        let e = r
            .allowed(&user, &Ask::of(Verb::List, Resource::Queues))
            .await
            .unwrap_err();
        assert!(
            e.0.contains("SubjectAccessReview") && e.0.contains("within 50 ms"),
            "{e}"
        );
        assert!(r.access.lock().unwrap().is_empty());
    }
}
