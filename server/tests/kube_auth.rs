//! Who may do what when the Kubernetes API decides (`--kube-auth`), with a real API
//! server (etcd + kube-apiserver from the team's control plane, see README) and three
//! `gangway serve` processes running as the chart's ServiceAccount under the chart's
//! ClusterRole: real ServiceAccount tokens (TokenRequest) for an administrator, two
//! tenants, a node agent and a viewer, bound to the chart's user ClusterRoles, and the
//! same permission matrix as `authz.rs` answered through TokenReview and
//! SubjectAccessReview.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gangway_kube_env::{ControlPlane, Identity, Options};
use gangway_proto::admin::StatusRequest;
use serde_json::json;
use support::matrix::{self, Caller, Role, NODE_A, TEAM_A, TEAM_B};
use support::Cluster;
use tonic::transport::Endpoint;

/// gangway's own ServiceAccount (namespace, name), as the chart makes it.
const GANGWAY_SA: (&str, &str) = ("gangway", "gangway");
/// The namespace of the administrator's, node agent's and viewer's ServiceAccounts.
const USERS: &str = "gangway-users";

/// Makes each role's ServiceAccount, binds it as the chart's README says, and returns
/// its token.
async fn role_tokens(api: &ControlPlane) -> BTreeMap<Role, String> {
    let roles = support::chart::apply_user_roles(api).await;
    for want in [
        "gangway-admin",
        "gangway-viewer",
        "gangway-tenant",
        "gangway-node",
    ] {
        assert!(
            roles.iter().any(|r| r == want),
            "the chart ships {want}: {roles:?}"
        );
    }
    let bind = support::chart::bind;
    bind(api, "gangway-admin", USERS, "ops", None).await;
    bind(api, "gangway-viewer", USERS, "dashboards", None).await;
    for team in [TEAM_A, TEAM_B] {
        bind(api, "gangway-tenant", team, "runner", Some(team)).await;
        // What the chart leaves to the operator: the tenant's queues and priorities.
        let grants = format!("{team}-grants");
        support::chart::cluster_role(
            api,
            &grants,
            json!([
                {"apiGroups": ["gangway.dev"], "resources": ["queues"], "verbs": ["get", "list"]},
                {"apiGroups": ["gangway.dev"], "resources": ["queues"], "verbs": ["use"], "resourceNames": [team]},
                {"apiGroups": ["gangway.dev"], "resources": ["priorities"], "verbs": ["use"], "resourceNames": ["0", "100"]}
            ]),
        )
        .await;
        bind(api, &grants, team, "runner", None).await;
    }
    support::chart::cluster_role(
        api,
        "agent-a",
        json!([{"apiGroups": ["gangway.dev"], "resources": ["nodes"], "verbs": ["get", "update"], "resourceNames": [NODE_A]}]),
    )
    .await;
    bind(api, "agent-a", USERS, "agent-a", None).await;
    let mut tokens = BTreeMap::new();
    for (role, ns, account) in [
        (Role::Admin, USERS, "ops"),
        (Role::Viewer, USERS, "dashboards"),
        (Role::TenantA, TEAM_A, "runner"),
        (Role::TenantB, TEAM_B, "runner"),
        (Role::Node, USERS, "agent-a"),
    ] {
        let token = api
            .service_account_token(ns, account)
            .await
            .unwrap_or_else(|e| panic!("a token for {ns}/{account}: {e}"));
        tokens.insert(role, token);
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_every_role_as_rbac_says() {
    let sa = Identity::service_account(GANGWAY_SA.0, GANGWAY_SA.1);
    let api = ControlPlane::start(Options {
        identities: vec![sa.clone()],
        controllers: Vec::new(),
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane starts: {e}"));
    for ns in [GANGWAY_SA.0, USERS, TEAM_A, TEAM_B] {
        api.ensure_namespace(ns).await.expect("namespace");
    }
    support::chart::apply_gangway_rbac(&api, "gangway", GANGWAY_SA.0, GANGWAY_SA.1).await;
    let tokens = role_tokens(&api).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, &sa.user)
        .expect("kubeconfig");
    let args = vec![
        "--kubeconfig".to_string(),
        kubeconfig.display().to_string(),
        "--kube-auth".to_string(),
    ];
    let cluster = Cluster::start_with(3, 2, args, Vec::new());
    let channel = Endpoint::from_shared(format!("http://{}", cluster.procs[&3].grpc))
        .expect("endpoint")
        .connect_lazy();
    let mut callers: BTreeMap<Role, Caller> = tokens
        .iter()
        .map(|(role, token)| {
            (
                *role,
                Caller {
                    channel: channel.clone(),
                    token: Some(token.clone()),
                },
            )
        })
        .collect();
    callers.insert(
        Role::Nobody,
        Caller {
            channel: channel.clone(),
            token: None,
        },
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let status = callers[&Role::Admin]
            .admin()
            .status(StatusRequest {
                include_state_hash: false,
            })
            .await;
        match status {
            Ok(s) if s.get_ref().groups.iter().all(|g| g.leader != 0) => break,
            other => assert!(
                Instant::now() < deadline,
                "the administrator's token opens the cluster: {other:?}\n{}",
                cluster.log(3)
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let group = matrix::prepare(&callers[&Role::Admin], &callers[&Role::TenantA]).await;
    let (table, wrong) = matrix::run(&callers, group, matrix::Authority::Kubernetes).await;
    eprintln!("{table}");
    assert!(
        wrong.is_empty(),
        "cells differ from the RBAC rules:\n{}\n{table}\n{}",
        wrong.join("\n"),
        cluster.log(3)
    );
    // The tokens were reviewed, and every review was gangway's own to make.
    let audit = api.audit();
    let reviews = audit
        .iter()
        .filter(|e| e.resource == "tokenreviews" || e.resource == "subjectaccessreviews")
        .count();
    assert!(reviews > 0, "gangway asked the API server");
    let refused: Vec<_> = audit
        .iter()
        .filter(|e| e.user == sa.user && e.code == 403)
        .collect();
    assert!(
        refused.is_empty(),
        "gangway's reviews were refused: {refused:#?}"
    );
}
