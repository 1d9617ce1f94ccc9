//! Unit tests of `scheduler_config.rs`.

use super::*;

fn doc(profile: &str) -> String {
    format!("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  qps: 1000\nprofiles:\n{profile}")
}

const BIN_PACKING: &str = "\
- schedulerName: gangway
  percentageOfNodesToScore: 100
  plugins:
    score:
      disabled:
      - name: NodeResourcesBalancedAllocation
      - name: ImageLocality
      enabled:
      - name: NodeResourcesFit
        weight: 5
  pluginConfig:
  - name: NodeResourcesFit
    args:
      apiVersion: kubescheduler.config.k8s.io/v1
      kind: NodeResourcesFitArgs
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: nvidia.com/gpu
          weight: 3
        - name: cpu
          weight: 1
";

#[test]
fn a_bin_packing_profile_becomes_most_allocated_over_its_resources() {
    let text = doc(BIN_PACKING);
    assert!(is_scheduler_config(&text));
    let profile = parse(&text, "gangway").expect("parses");
    assert_eq!(profile.weight_of(ScorePlugin::MostAllocated), Some(5));
    assert_eq!(profile.weight_of(ScorePlugin::LeastAllocated), None);
    assert_eq!(profile.weight_of(ScorePlugin::BalancedAllocation), None);
    assert_eq!(
        profile.weight_of(ScorePlugin::TaintToleration),
        Some(3),
        "defaults stay"
    );
    assert_eq!(
        profile
            .fit_resources
            .iter()
            .map(|r| (r.name.as_str(), r.weight))
            .collect::<Vec<_>>(),
        vec![("nvidia.com/gpu", 3), ("cpu", 1)]
    );
    assert_eq!(profile.percentage_of_nodes_to_score, 100);
}

#[test]
fn requested_to_capacity_ratio_takes_its_shape_and_star_disables_every_default() {
    let text = doc("\
- schedulerName: gangway
  plugins:
    multiPoint:
      disabled:
      - name: '*'
      enabled:
      - name: NodeResourcesFit
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: RequestedToCapacityRatio
        requestedToCapacityRatio:
          shape:
          - {utilization: 0, score: 10}
          - {utilization: 100, score: 0}
");
    let profile = parse(&text, "gangway").expect("parses");
    assert_eq!(
        profile.score_plugins,
        vec![PluginWeight {
            plugin: ScorePlugin::RequestedToCapacityRatio,
            weight: 1
        }]
    );
    assert_eq!(
        profile.shape[0],
        ShapePoint {
            utilization: 0,
            score: 10
        }
    );
}

#[test]
fn no_profile_for_gangway_and_process_settings_leave_the_default() {
    let text = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nleaderElection:\n  leaderElect: false\npercentageOfNodesToScore: 30\n";
    let profile = parse(text, "gangway").expect("parses");
    assert_eq!(profile.score_plugins, Profile::default().score_plugins);
    assert_eq!(profile.percentage_of_nodes_to_score, 30);
}

/// Every refusal names the field, and says why.
#[test]
fn what_gangway_cannot_do_is_refused_by_name() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n".into(),
            "apiVersion",
            "expected \"kubescheduler.config.k8s.io/v1\"",
        ),
        (
            doc("- schedulerName: default-scheduler\n"),
            "profiles[0].schedulerName",
            "is not gangway's scheduler name",
        ),
        (
            doc("- plugins: {}\n"),
            "profiles[0].schedulerName",
            "\"default-scheduler\" is not gangway's",
        ),
        (
            doc("- schedulerName: gangway\n- schedulerName: gangway\n"),
            "profiles[1].schedulerName",
            "two profiles",
        ),
        (
            doc("- schedulerName: gangway\n  plugins:\n    score:\n      enabled:\n      - name: ImageLocality\n"),
            "profiles[0].plugins.score.enabled[0].name",
            "does not implement the score plugin \"ImageLocality\"",
        ),
        (
            doc("- schedulerName: gangway\n  plugins:\n    score:\n      enabled:\n      - name: MyPlugin\n"),
            "profiles[0].plugins.score.enabled[0].name",
            "unknown score plugin \"MyPlugin\"",
        ),
        (
            doc("- schedulerName: gangway\n  plugins:\n    filter:\n      disabled:\n      - name: NodePorts\n"),
            "profiles[0].plugins.filter",
            "only score (and multiPoint) plugins",
        ),
        (
            doc("- schedulerName: gangway\n  pluginConfig:\n  - name: InterPodAffinity\n    args: {hardPodAffinityWeight: 2}\n"),
            "profiles[0].pluginConfig[0].name",
            "NodeResourcesFit only",
        ),
        (
            doc("- schedulerName: gangway\n  pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy: {type: Fastest}\n"),
            "profiles[0].pluginConfig[0].args.scoringStrategy.type",
            "expected LeastAllocated, MostAllocated or RequestedToCapacityRatio",
        ),
        (
            doc("- schedulerName: gangway\n  pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      ignoredResources: [foo]\n"),
            "profiles[0].pluginConfig[0].args.ignoredResources",
            "not supported",
        ),
        (
            doc("- schedulerName: gangway\n  plugins:\n    score:\n      enabled:\n      - name: NodeAffinity\n        weight: 500\n"),
            "profiles[0]",
            "weight",
        ),
        (
            doc("- schedulerName: gangway\n  percentageOfNodesToScore: 150\n"),
            "profiles[0].percentageOfNodesToScore",
            "not a percentage",
        ),
        (
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofile: []\n".into(),
            "profile",
            "unknown field",
        ),
    ];
    for (text, field, why) in cases {
        let err = parse(&text, "gangway").expect_err(&text);
        assert!(
            err.field.starts_with(field) && err.to_string().contains(why),
            "{text}\n→ {err}\n(expected {field}: …{why}…)"
        );
    }
}

#[test]
fn gangways_own_toml_is_not_taken_for_a_scheduler_configuration() {
    assert!(!is_scheduler_config(
        "shards = 2\nscheduler_name = \"gangway\"\n"
    ));
}
