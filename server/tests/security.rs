//! Mutual TLS and bearer tokens with three real `gangway serve` processes: the
//! cluster forms over TLS and schedules; clients without a certificate, with a
//! certificate of another CA, speaking plaintext, or without the right token are
//! refused with a clear error; a replica pointed at another cluster's data dir is
//! refused at start.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use gangway_client::api::NodeSpec;
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::{Client, ClientError, Credentials};
use serde_json::json;
use support::pki::Pki;
use support::{http_call, Cluster};

fn credentials(ca: &Path, cert: Option<(&Path, &Path)>, token: Option<&str>) -> Credentials {
    Credentials::from_files(
        Some(ca),
        cert.map(|c| c.0),
        cert.map(|c| c.1),
        token.map(String::from),
    )
    .expect("credentials")
}

/// What a client with `credentials` gets when it lists gang groups.
async fn attempt(cluster: &Cluster, credentials: Credentials) -> Result<(), String> {
    let client = Client::connect_with(&[cluster.procs[&1].grpc.clone()], credentials)
        .await
        .map_err(|e| e.to_string())?;
    client
        .list_groups(false)
        .await
        .map(|_| ())
        .map_err(|e| match e {
            ClientError::Rpc(s) => format!("{:?}: {}", s.code(), s.message()),
            other => other.to_string(),
        })
}

async fn wait_ready_http(cluster: &Cluster) {
    let start = Instant::now();
    loop {
        let mut ready = 0;
        for p in cluster.procs.values() {
            // The endpoint answers once the process has started.
            let probe = support::try_http_get(&p.http, "/readyz", Duration::from_secs(1)).await;
            if matches!(probe, Ok((200, _))) {
                ready += 1;
            }
        }
        if ready == cluster.procs.len() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "cluster not ready over TLS:\n{}\n---\n{}",
            cluster.log(1),
            cluster.log(2)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_and_tokens_secure_the_cluster_and_refuse_strangers() {
    let pki_dir = tempfile::tempdir().expect("tempdir");
    let dir = pki_dir.path();
    let pki = Pki::new(dir, "gangway-ca");
    let (server_cert, server_key) = pki.issue_peer(dir, "replica");
    let (client_cert, client_key) = pki.issue(dir, "operator");
    let stranger_pki = Pki::new(dir, "other-ca");
    let (stranger_cert, stranger_key) = stranger_pki.issue(dir, "stranger");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "# gangway bearer tokens\ns3cret-operator-token\n").expect("tokens");
    let path = |p: &Path| p.display().to_string();
    let args = vec![
        "--tls-cert".into(),
        path(&server_cert),
        "--tls-key".into(),
        path(&server_key),
        "--tls-client-ca".into(),
        path(&pki.ca),
        "--auth-tokens-file".into(),
        path(&tokens),
        // The web view's sign-in is tried over the plaintext HTTP port below.
        "--ui-plaintext-tokens".into(),
    ];
    let mut cluster = Cluster::start_with(3, 2, args, Vec::new());
    wait_ready_http(&cluster).await;

    // The operator (certificate + token) registers a node and places a gang.
    let good = credentials(
        &pki.ca,
        Some((&client_cert, &client_key)),
        Some("s3cret-operator-token"),
    );
    let client = Client::connect_with(&[cluster.procs[&2].grpc.clone()], good.clone())
        .await
        .expect("connect with credentials");
    client
        .register_node(NodeSpec {
            name: "tls-node".into(),
            allocatable: [("cpu", "8"), ("memory", "16Gi"), ("pods", "110")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
        .await
        .expect("register a node over mTLS");
    let request = GangGroupBuilder::new("secure".to_string())
        .gang(GangBuilder::new("team", "workers", 2).members(
            "w",
            2,
            json!({"requests": {"cpu": "1"}}),
        ))
        .build();
    let submitted = client.submit(request).await.expect("submit over mTLS");
    let start = Instant::now();
    loop {
        let groups = client.list_groups(false).await.expect("list");
        if groups
            .iter()
            .any(|g| g.id == submitted.id && g.state == "Placed")
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not placed: {groups:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    web_view_asks_for_a_token(&cluster, "s3cret-operator-token").await;

    // Strangers.
    let no_cert = attempt(
        &cluster,
        credentials(&pki.ca, None, Some("s3cret-operator-token")),
    )
    .await;
    let err = no_cert.expect_err("a client without a certificate is refused");
    assert!(
        err.starts_with("Unauthenticated: client certificate required"),
        "no certificate: {err}"
    );
    let foreign = attempt(
        &cluster,
        credentials(
            &pki.ca,
            Some((&stranger_cert, &stranger_key)),
            Some("s3cret-operator-token"),
        ),
    )
    .await;
    let err = foreign.expect_err("a certificate of another CA is refused");
    eprintln!("certificate of another CA: {err}");
    let plaintext = attempt(&cluster, Credentials::default()).await;
    let err = plaintext.expect_err("plaintext is refused when TLS is configured");
    eprintln!("plaintext: {err}");
    let no_token = attempt(
        &cluster,
        credentials(&pki.ca, Some((&client_cert, &client_key)), None),
    )
    .await;
    let err = no_token.expect_err("no token");
    assert!(
        err.starts_with("Unauthenticated: missing bearer token"),
        "{err}"
    );
    let wrong = attempt(
        &cluster,
        credentials(&pki.ca, Some((&client_cert, &client_key)), Some("guess")),
    )
    .await;
    assert_eq!(
        wrong,
        Err("Unauthenticated: bearer token not accepted".to_string())
    );
    // A client certificate alone cannot reach the Raft transport either.
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(&pki.ca).expect("ca"),
        ))
        .identity(tonic::transport::Identity::from_pem(
            std::fs::read(&client_cert).expect("cert"),
            std::fs::read(&client_key).expect("key"),
        ));
    let channel =
        tonic::transport::Endpoint::from_shared(format!("https://{}", cluster.procs[&1].grpc))
            .expect("endpoint")
            .tls_config(tls)
            .expect("tls")
            .connect()
            .await
            .expect("connect with a client certificate");
    let refused = gangway_proto::raft::raft_transport_client::RaftTransportClient::new(channel)
        .propose(gangway_proto::raft::ProposeRequest::default())
        .await
        .expect_err("no token, no proposal");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    for id in 1..=3 {
        assert!(
            !cluster.log(id).contains("s3cret-operator-token"),
            "the token never reaches a log"
        );
    }

    // Replica 3 restarted on its data dir under another cluster id: refused at start.
    cluster.kill(3);
    cluster.cluster_id = "another-cluster".into();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::from(cluster.command(3)).output(),
    )
    .await
    .expect("gangway serve exits by itself")
    .expect("run gangway serve");
    assert!(
        !out.status.success(),
        "a foreign cluster id on this data dir must not start"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not cluster \"another-cluster\""),
        "the refusal names both clusters: {stderr}"
    );
}

/// The web view under tokens: nothing without one, the same pages with a Bearer
/// token or the sign-in session, and the cluster panel reads every peer over mutual TLS
/// as a peer.
async fn web_view_asks_for_a_token(cluster: &Cluster, token: &str) {
    let http = cluster.procs[&1].http.clone();
    let (code, _, body) = http_call(&http, "GET", "/ui/gangs", &[], "").await;
    assert_eq!(code, 401, "no token: {body}");
    assert!(
        body.contains("requires a token"),
        "the sign-in page: {body}"
    );
    assert!(
        !body.contains("secure"),
        "no gang shown without a token: {body}"
    );
    let (code, _, _) = http_call(&http, "GET", "/ui/events", &[], "").await;
    assert_eq!(code, 401, "no event stream without a token");
    let (code, _, _) = http_call(
        &http,
        "GET",
        "/ui/panel/fleet",
        &[("Authorization", "Bearer wrong")],
        "",
    )
    .await;
    assert_eq!(code, 401, "a wrong token");

    let bearer = format!("Bearer {token}");
    let (code, _, body) = http_call(&http, "GET", "/ui", &[("Authorization", &bearer)], "").await;
    assert_eq!(code, 200, "{body}");
    for id in 1..=3 {
        assert!(
            body.contains(&format!("<tr data-replica=\"{id}\"><td>{id}")),
            "replica {id} listed: {body}"
        );
    }
    assert_eq!(
        body.matches("<td class=\"ok\">up</td>").count(),
        3,
        "every peer's status read over mutual TLS: {body}"
    );

    let (code, _, body) = http_call(
        &http,
        "POST",
        "/ui/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        "token=not-it",
    )
    .await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("token not accepted"), "{body}");
    let (code, head, _) = http_call(
        &http,
        "POST",
        "/ui/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &format!("token={token}"),
    )
    .await;
    assert_eq!(code, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("a cookie is set: {head}"))
        .to_string();
    assert!(head.contains("HttpOnly"), "{head}");
    assert!(
        cookie.starts_with("gangway_ui_session=") && !cookie.contains(token),
        "the cookie is a session id, not the token: {cookie}"
    );
    let (code, _, body) = http_call(&http, "GET", "/ui/gangs", &[("Cookie", &cookie)], "").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("data-name=\"secure\""),
        "the placed gang shows: {body}"
    );
}
