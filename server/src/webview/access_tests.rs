//! Unit tests of `access.rs`.

use super::*;
use crate::auth::PolicyFile;
use crate::security::Tokens;

fn ui(policy: &str) -> (UiAccess, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy).expect("write");
    let credentials = Credentials {
        tls: false,
        client_certs_optional: false,
        tokens: None,
        policy: Some(PolicyFile::load(path).expect("policy")),
        kube_review: false,
        peer_secret: Tokens::generated_peer_secret().expect("secret"),
        cluster_id: "gangway".into(),
        node_id: 1,
        accept_legacy_secret: false,
    };
    (
        UiAccess::new(Arc::new(credentials), Access::policy_only()),
        dir,
    )
}

const POLICY: &str = r#"
identities:
  - {name: watcher, roles: [viewer], tokens: [viewer-token-0123456789]}
  - name: team-a
    roles: [tenant]
    tokens: [tenant-token-0123456789]
    tenant: {namespaces: [team-a], queues: [team-a], defaultQueue: team-a}
"#;

#[tokio::test]
async fn viewers_sign_in_with_a_session_that_is_not_the_token() {
    let (ui, _dir) = ui(POLICY);
    let now = Instant::now();
    let id = ui
        .sign_in(None, "viewer-token-0123456789", now)
        .await
        .expect("a viewer signs in");
    assert_eq!(id.len(), 2 * UI_SESSION_ID_BYTES);
    assert!(!id.contains("viewer-token"));
    assert_eq!(ui.session(&id, now).await, Ok("watcher".to_string()));
    let later = now + Duration::from_millis(UI_SESSION_TTL_MS + 1);
    assert!(ui.session(&id, later).await.is_err(), "sessions expire");
    ui.sign_out(&id);
    assert!(ui.session(&id, now).await.is_err());
    let tenant = ui.sign_in(None, "tenant-token-0123456789", now).await;
    assert!(matches!(tenant, Err(Refusal::Forbidden(_))), "{tenant:?}");
}

#[tokio::test]
async fn failed_sign_ins_are_limited_per_address() {
    let (ui, _dir) = ui(POLICY);
    let ip: IpAddr = [127, 0, 0, 9].into();
    let now = Instant::now();
    for _ in 0..UI_SIGN_IN_FAILURES_MAX {
        let r = ui.sign_in(Some(ip), "wrong-token-0123456789", now).await;
        assert!(matches!(r, Err(Refusal::Unauthenticated(_))), "{r:?}");
    }
    let blocked = ui.sign_in(Some(ip), "viewer-token-0123456789", now).await;
    assert_eq!(blocked, Err(Refusal::TooMany), "even a good token waits");
    let other: IpAddr = [127, 0, 0, 10].into();
    assert!(ui
        .sign_in(Some(other), "viewer-token-0123456789", now)
        .await
        .is_ok());
    let later = now + Duration::from_millis(UI_SIGN_IN_WINDOW_MS);
    assert!(ui
        .sign_in(Some(ip), "viewer-token-0123456789", later)
        .await
        .is_ok());
}

#[tokio::test]
async fn a_session_ends_when_its_token_is_withdrawn_and_tokens_need_tls_on_a_tls_cluster() {
    let (ui, dir) = ui(POLICY);
    let now = Instant::now();
    let id = ui
        .sign_in(None, "viewer-token-0123456789", now)
        .await
        .expect("signed in");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(
        dir.path().join("policy.yaml"),
        "identities: [{name: other, roles: [viewer], tokens: [other-token-0123456789]}]",
    )
    .expect("write");
    if let Some(p) = &ui.credentials.policy {
        p.reload_if_changed();
    }
    let refused = ui.session(&id, now).await;
    assert!(
        matches!(&refused, Err(Refusal::Unauthenticated(why)) if why.contains("withdrawn")),
        "{refused:?}"
    );
    let strict = ui.clone().tokens_over_tls_only(true);
    assert!(matches!(
        strict.check_transport(false),
        Err(Refusal::Forbidden(_))
    ));
    assert!(strict.check_transport(true).is_ok());
    assert!(ui.check_transport(false).is_ok());
}
