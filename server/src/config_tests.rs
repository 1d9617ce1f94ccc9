//! Unit tests of `config.rs`.

use super::*;

fn args(id: u64, peers: &[&str]) -> ServeArgs {
    ServeArgs {
        id: Some(id),
        peers: peers.iter().map(|s| s.to_string()).collect(),
        peer_secret_file: Some(PathBuf::from("peer-secret")),
        ..Default::default()
    }
}

#[test]
fn a_replica_with_peers_needs_the_peer_secret() {
    let mut a = args(1, &["2=127.0.0.1:7002"]);
    a.peer_secret_file = None;
    let err = ServeConfig::resolve(a.clone()).expect_err("no secret");
    assert!(err.to_string().starts_with("--peer-secret-file"), "{err}");
    a.peers.clear();
    a.join = true;
    assert!(
        ServeConfig::resolve(a.clone()).is_err(),
        "a joiner has peers"
    );
    a.join = false;
    let alone = ServeConfig::resolve(a).expect("no peers, no secret");
    assert_eq!(alone.peer_secret_file, None);
}

#[test]
fn tls_needs_all_three_files() {
    let mut a = args(1, &[]);
    a.tls_cert = Some(PathBuf::from("cert.pem"));
    a.tls_client_ca = Some(PathBuf::from("ca.pem"));
    let err = ServeConfig::resolve(a).expect_err("no key").to_string();
    assert!(err.contains("missing --tls-key"), "{err}");
}

#[test]
fn peer_routes_are_for_fault_tests_only() {
    let mut a = args(1, &["2=127.0.0.1:7002"]);
    a.test_peer_routes = vec!["127.0.0.1:7002=127.0.0.1:9002".into()];
    let err = ServeConfig::resolve(a.clone()).expect_err("no --test-failpoints");
    assert!(err.to_string().contains("--test-peer-route"), "{err}");
    assert!(err.to_string().contains("--test-failpoints"), "{err}");
    a.test_failpoints = true;
    let cfg = ServeConfig::resolve(a.clone()).expect("routes with failpoints");
    assert_eq!(cfg.peer_routes["127.0.0.1:7002"], "127.0.0.1:9002");
    a.test_peer_routes.push("127.0.0.1:7002".into());
    let err = ServeConfig::resolve(a).expect_err("not ADDR=VIA");
    assert!(err.to_string().contains("not ADDR=VIA"), "{err}");
}

#[test]
fn peer_naming_itself_is_refused() {
    let err = ServeConfig::resolve(args(1, &["1=127.0.0.1:7001"])).expect_err("self peer");
    assert!(
        err.to_string().contains("names this process itself"),
        "{err}"
    );
}

#[test]
fn malformed_peers_name_the_flag() {
    for bad in ["2", "x=127.0.0.1:1", "2=localhost", "2=:80"] {
        let err = ServeConfig::resolve(args(1, &[bad])).expect_err(bad);
        assert!(err.to_string().starts_with("--peer:"), "{err}");
    }
    let err = ServeConfig::resolve(args(1, &["2=a:1", "2=b:1"])).expect_err("duplicate");
    assert!(err.to_string().contains("listed twice"), "{err}");
}

#[test]
fn shards_and_ids_are_bounded() {
    let err = ServeConfig::resolve(ServeArgs {
        shards: Some(0),
        ..args(1, &[])
    })
    .expect_err("0 shards");
    assert!(err.to_string().starts_with("--shards"), "{err}");
    let err = ServeConfig::resolve(args(0, &[])).expect_err("id 0");
    assert!(err.to_string().starts_with("--id"), "{err}");
}

#[test]
fn config_file_keys_and_flag_precedence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gangway.toml");
    std::fs::write(
        &path,
        "id = 2\nshards = 6\npeer-secret-file = \"s\"\n[peers]\n1 = \"127.0.0.1:7001\"\n",
    )
    .expect("write");
    let cfg = ServeConfig::resolve(ServeArgs {
        config: Some(path.clone()),
        shards: Some(3),
        ..Default::default()
    })
    .expect("valid");
    assert_eq!((cfg.id, cfg.shards), (2, 3));
    assert_eq!(
        cfg.peers.get(&1).map(String::as_str),
        Some("127.0.0.1:7001")
    );
    std::fs::write(&path, "id = 2\nshardz = 6\n").expect("write");
    let err = ServeConfig::resolve(ServeArgs {
        config: Some(path),
        ..Default::default()
    })
    .expect_err("unknown key");
    assert!(err.to_string().contains("shardz"), "{err}");
}

#[test]
fn rebalancing_defaults_on_at_125_percent_and_a_bad_bound_names_the_key() {
    let cfg = ServeConfig::resolve(args(1, &[])).expect("valid");
    assert!(cfg.rebalance.auto);
    assert_eq!(cfg.rebalance.bound_percent, 125);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gangway.toml");
    let file = |path: &PathBuf| ServeArgs {
        config: Some(path.clone()),
        ..Default::default()
    };
    std::fs::write(
        &path,
        "id = 1\nauto-rebalance = false\nrebalance-bound-percent = 150\n",
    )
    .expect("write");
    let cfg = ServeConfig::resolve(file(&path)).expect("valid");
    assert!(!cfg.rebalance.auto);
    assert_eq!(cfg.rebalance.bound_percent, 150);
    std::fs::write(&path, "id = 1\nrebalance-bound-percent = 100\n").expect("write");
    let err = ServeConfig::resolve(file(&path)).expect_err("out of range");
    assert!(err.to_string().contains("rebalance-bound-percent"), "{err}");
}

#[test]
fn fair_share_over_time_defaults_off_and_a_half_life_out_of_range_names_the_flag() {
    assert_eq!(
        ServeConfig::resolve(args(1, &[]))
            .expect("valid")
            .fair_share_half_life_ms,
        0
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gangway.toml");
    std::fs::write(&path, "id = 1\nfair-share-half-life-ms = 604800000\n").expect("write");
    let cfg = ServeConfig::resolve(ServeArgs {
        config: Some(path),
        ..Default::default()
    })
    .expect("valid");
    assert_eq!(cfg.fair_share_half_life_ms, 604_800_000);
    let err = ServeConfig::resolve(ServeArgs {
        fair_share_half_life_ms: Some(999),
        ..args(1, &[])
    })
    .expect_err("below a second");
    assert_eq!(
        err.to_string(),
        "--fair-share-half-life-ms: 999 is not 0 (off) or in 1000..=31536000000"
    );
}

#[test]
fn head_reservations_default_off_and_a_file_sets_them() {
    use gangway_core::plan::backfill::ReservationMode;
    let cfg = ServeConfig::resolve(args(1, &[])).expect("valid");
    assert_eq!(cfg.head_reservations, ReservationMode::Off);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gangway.toml");
    std::fs::write(&path, "id = 1\nhead-reservations = \"backfill\"\n").expect("write");
    let cfg = ServeConfig::resolve(ServeArgs {
        config: Some(path.clone()),
        ..Default::default()
    })
    .expect("valid");
    assert_eq!(cfg.head_reservations, ReservationMode::Backfill);
    // The flag wins over the file.
    let cfg = ServeConfig::resolve(ServeArgs {
        config: Some(path.clone()),
        head_reservations: Some(ReservationMode::Reserve),
        ..Default::default()
    })
    .expect("valid");
    assert_eq!(cfg.head_reservations, ReservationMode::Reserve);
    std::fs::write(&path, "id = 1\nhead-reservations = \"always\"\n").expect("write");
    let err = ServeConfig::resolve(ServeArgs {
        config: Some(path),
        ..Default::default()
    })
    .expect_err("not a mode");
    assert!(err.to_string().contains("head-reservations"), "{err}");
}

#[test]
fn wire_format_defaults_to_binary_and_a_bad_one_names_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gangway.toml");
    assert_eq!(
        ServeConfig::resolve(args(1, &[])).expect("valid").wire,
        WireFormat::Binary
    );
    std::fs::write(&path, "id = 1\nwire-format = \"json\"\n").expect("write");
    let file = |path: &PathBuf| ServeArgs {
        config: Some(path.clone()),
        ..Default::default()
    };
    assert_eq!(
        ServeConfig::resolve(file(&path)).expect("valid").wire,
        WireFormat::Json
    );
    let flag = ServeConfig::resolve(ServeArgs {
        wire_format: Some(WireFormat::Binary),
        ..file(&path)
    })
    .expect("valid");
    assert_eq!(flag.wire, WireFormat::Binary, "the flag wins");
    std::fs::write(&path, "id = 1\nwire-format = \"xml\"\n").expect("write");
    let err = ServeConfig::resolve(file(&path)).expect_err("unknown format");
    assert!(err.to_string().contains("wire-format"), "{err}");
}

const PACKING: &str = "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: gangway
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
";

#[test]
fn a_kube_scheduler_configuration_sets_the_profile_through_either_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("scheduler.yaml");
    std::fs::write(&path, PACKING).expect("write");
    let mut a = args(1, &[]);
    a.scheduler_config = Some(path.clone());
    let cfg = ServeConfig::resolve(a.clone()).expect("scheduler config");
    let most = gangway_core::engine::ScorePlugin::MostAllocated;
    assert_eq!(cfg.profile.weight_of(most), Some(1));
    // kube-scheduler users pass it as --config.
    let mut b = args(1, &[]);
    b.config = Some(path.clone());
    assert_eq!(
        ServeConfig::resolve(b.clone())
            .expect("as --config")
            .profile,
        cfg.profile
    );
    b.scheduler_config = Some(path.clone());
    let both = ServeConfig::resolve(b).expect_err("twice").to_string();
    assert!(both.contains("--config/--scheduler-config"), "{both}");
    // Another scheduler name's profile is refused, naming the file and the field.
    a.scheduler_name = Some("batch".into());
    a.kubeconfig = Some(dir.path().join("kubeconfig"));
    let err = ServeConfig::resolve(a).expect_err("other name").to_string();
    assert!(
        err.contains("scheduler.yaml") && err.contains("profiles[0].schedulerName"),
        "{err}"
    );
    assert_eq!(
        ServeConfig::resolve(args(1, &[])).expect("default").profile,
        gangway_core::engine::Profile::default()
    );
}

#[test]
fn topology_levels_come_from_flags_or_the_file_and_a_bad_one_names_the_flag() {
    let cfg = ServeConfig::resolve(ServeArgs {
        topology_levels: vec![
            "example.com/block, example.com/rack,kubernetes.io/hostname".into(),
            "example.com/nvlink".into(),
        ],
        ..args(1, &[])
    })
    .expect("valid");
    let levels: Vec<Vec<String>> = cfg
        .profile
        .topologies
        .iter()
        .map(|h| h.levels.clone())
        .collect();
    assert_eq!(
        levels,
        vec![
            vec![
                "example.com/block",
                "example.com/rack",
                "kubernetes.io/hostname"
            ],
            vec!["example.com/nvlink"],
        ]
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gangway.toml");
    std::fs::write(&path, "id = 1\ntopology-levels = [\"example.com/rack\"]\n").expect("write");
    let cfg = ServeConfig::resolve(ServeArgs {
        config: Some(path),
        ..Default::default()
    })
    .expect("valid");
    assert_eq!(cfg.profile.topologies.len(), 1);
    for bad in ["example.com/rack,example.com/rack", "not a key!", ","] {
        let err = ServeConfig::resolve(ServeArgs {
            topology_levels: vec![bad.into()],
            ..args(1, &[])
        })
        .expect_err(bad);
        assert!(
            err.to_string().contains("--topology-levels"),
            "{bad}: {err}"
        );
    }
}
