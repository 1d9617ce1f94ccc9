//! Unit tests of `kube.rs`.

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
