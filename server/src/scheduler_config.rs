//! kube-scheduler's configuration file (`KubeSchedulerConfiguration`,
//! `kubescheduler.config.k8s.io/v1`), read for the parts gangway implements and turned
//! into the engine's [`Profile`]: the profile whose `schedulerName` is gangway's, its
//! score plugins (`plugins.score` and `plugins.multiPoint`, enabled with weights or
//! disabled, `*` for every default), `NodeResourcesFit`'s scoring strategy
//! (`LeastAllocated`, `MostAllocated`, `RequestedToCapacityRatio` with its resources,
//! weights and shape) and `percentageOfNodesToScore`.
//!
//! Everything else that would change where pods go is refused by name rather than
//! ignored: a plugin gangway does not implement, another extension point, another
//! plugin's arguments, a second profile. Settings of kube-scheduler's own process
//! (`clientConnection`, `leaderElection`, `parallelism`, backoffs) are accepted and have
//! no effect. Pure: `gangway serve` and `gangway dev` read the file and pass its text.

use serde_json::{Map, Value};

use gangway_core::engine::{PluginWeight, Profile, ResourceWeight, ScorePlugin, ShapePoint};

/// The API version read.
pub const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";
/// The kind read.
pub const KIND: &str = "KubeSchedulerConfiguration";
/// A profile's scheduler name when it names none (kube-scheduler's default).
const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// Top-level fields of kube-scheduler's own process: accepted, without effect here.
const PROCESS_FIELDS: [&str; 9] = [
    "clientConnection",
    "leaderElection",
    "parallelism",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "enableProfiling",
    "enableContentionProfiling",
    "delayCacheUntilActive",
    "extenders",
];

/// kube-scheduler's score plugins gangway does not implement (disabling them is fine).
const UNIMPLEMENTED_SCORE_PLUGINS: [&str; 3] =
    ["ImageLocality", "PodTopologySpread", "VolumeBinding"];

/// Extension points other than scoring (gangway's filters and queue are fixed).
const OTHER_EXTENSION_POINTS: [&str; 12] = [
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
    "placementFeasible",
];

/// A configuration gangway cannot take; `field` is the path in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SchedulerConfigError {
    /// Where, as a path in the document (`profiles[0].plugins.score.enabled[1].name`).
    pub field: String,
    /// Why.
    pub reason: String,
}

fn refuse(field: impl Into<String>, reason: impl Into<String>) -> SchedulerConfigError {
    SchedulerConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Whether `text` is a `KubeSchedulerConfiguration` document (as opposed to gangway's own
/// TOML configuration).
pub fn is_scheduler_config(text: &str) -> bool {
    text.lines()
        .any(|l| l.trim_start().starts_with("kind:") && l.contains(KIND))
}

/// The profile `text` configures for pods whose `schedulerName` is `scheduler_name`.
pub fn parse(text: &str, scheduler_name: &str) -> Result<Profile, SchedulerConfigError> {
    let doc: Value =
        serde_saphyr::from_str(text).map_err(|e| refuse("(document)", e.to_string()))?;
    let top = doc
        .as_object()
        .ok_or_else(|| refuse("(document)", "not a mapping"))?;
    expect_text(top, "apiVersion", API_VERSION)?;
    expect_text(top, "kind", KIND)?;
    for key in top.keys() {
        let known = ["apiVersion", "kind", "profiles", "percentageOfNodesToScore"];
        if !known.contains(&key.as_str()) && !PROCESS_FIELDS.contains(&key.as_str()) {
            return Err(refuse(key.as_str(), "unknown field"));
        }
    }
    let mut profile = Profile::default();
    if let Some(p) = top.get("percentageOfNodesToScore") {
        profile.percentage_of_nodes_to_score = percentage("percentageOfNodesToScore", p)?;
    }
    let profiles = match top.get("profiles") {
        None | Some(Value::Null) => return checked(profile, "(document)"),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(refuse("profiles", "not a list")),
    };
    let mut ours = None;
    for (i, p) in profiles.iter().enumerate() {
        let at = format!("profiles[{i}]");
        let fields = p
            .as_object()
            .ok_or_else(|| refuse(at.as_str(), "not a mapping"))?;
        let name = match fields.get("schedulerName") {
            None => DEFAULT_SCHEDULER_NAME,
            Some(v) => v
                .as_str()
                .ok_or_else(|| refuse(format!("{at}.schedulerName"), "not a string"))?,
        };
        if name != scheduler_name {
            return Err(refuse(
                format!("{at}.schedulerName"),
                format!(
                    "\"{name}\" is not gangway's scheduler name (\"{scheduler_name}\", --scheduler-name): gangway schedules one schedulerName; give only its profile"
                ),
            ));
        }
        if ours.replace((at, fields)).is_some() {
            return Err(refuse(
                format!("profiles[{i}].schedulerName"),
                format!("\"{name}\" has two profiles"),
            ));
        }
    }
    let Some((at, fields)) = ours else {
        return checked(profile, "(document)");
    };
    apply_profile(&mut profile, &at, fields)?;
    checked(profile, &at)
}

fn checked(profile: Profile, at: &str) -> Result<Profile, SchedulerConfigError> {
    profile.validate().map_err(|e| refuse(at, e.to_string()))?;
    Ok(profile)
}

fn expect_text(
    fields: &Map<String, Value>,
    key: &str,
    want: &str,
) -> Result<(), SchedulerConfigError> {
    match fields.get(key).and_then(Value::as_str) {
        Some(v) if v == want => Ok(()),
        Some(v) => Err(refuse(key, format!("\"{v}\": expected \"{want}\""))),
        None => Err(refuse(key, format!("missing: expected \"{want}\""))),
    }
}

fn percentage(field: &str, value: &Value) -> Result<u32, SchedulerConfigError> {
    value
        .as_u64()
        .filter(|p| *p <= 100)
        .map(|p| p as u32)
        .ok_or_else(|| refuse(field, format!("{value} is not a percentage in 0..=100")))
}

fn apply_profile(
    profile: &mut Profile,
    at: &str,
    fields: &Map<String, Value>,
) -> Result<(), SchedulerConfigError> {
    for key in fields.keys() {
        let known = [
            "schedulerName",
            "plugins",
            "pluginConfig",
            "percentageOfNodesToScore",
        ];
        if !known.contains(&key.as_str()) {
            return Err(refuse(format!("{at}.{key}"), "unknown field"));
        }
    }
    if let Some(p) = fields.get("percentageOfNodesToScore") {
        let field = format!("{at}.percentageOfNodesToScore");
        profile.percentage_of_nodes_to_score = percentage(&field, p)?;
    }
    if let Some(plugins) = fields.get("plugins") {
        let plugins = plugins
            .as_object()
            .ok_or_else(|| refuse(format!("{at}.plugins"), "not a mapping"))?;
        for (point, set) in plugins {
            let field = format!("{at}.plugins.{point}");
            match point.as_str() {
                "score" | "multiPoint" => apply_plugin_set(profile, &field, set)?,
                p if OTHER_EXTENSION_POINTS.contains(&p) => {
                    let empty = set.as_object().is_none_or(|s| {
                        s.values()
                            .all(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))
                    });
                    if !empty {
                        return Err(refuse(
                            field,
                            "gangway's filters, queue and binding are fixed: only score (and multiPoint) plugins can be configured",
                        ));
                    }
                }
                _ => return Err(refuse(field, "unknown extension point")),
            }
        }
    }
    if let Some(configs) = fields.get("pluginConfig") {
        let configs = configs
            .as_array()
            .ok_or_else(|| refuse(format!("{at}.pluginConfig"), "not a list"))?;
        for (i, c) in configs.iter().enumerate() {
            apply_plugin_config(profile, &format!("{at}.pluginConfig[{i}]"), c)?;
        }
    }
    Ok(())
}

/// The score plugin kube-scheduler's `name` is, given the fit strategy in use.
fn score_plugin(
    name: &str,
    fit: ScorePlugin,
    field: &str,
) -> Result<Option<ScorePlugin>, SchedulerConfigError> {
    Ok(Some(match name {
        "NodeResourcesFit" => fit,
        "NodeResourcesBalancedAllocation" => ScorePlugin::BalancedAllocation,
        "NodeAffinity" => ScorePlugin::NodeAffinity,
        "TaintToleration" => ScorePlugin::TaintToleration,
        "InterPodAffinity" => ScorePlugin::InterPodAffinity,
        "DynamicResources" => ScorePlugin::DynamicResources,
        n if UNIMPLEMENTED_SCORE_PLUGINS.contains(&n) => return Ok(None),
        other => return Err(refuse(field, format!("unknown score plugin \"{other}\""))),
    }))
}

fn fit_strategy(profile: &Profile) -> ScorePlugin {
    profile
        .score_plugins
        .iter()
        .map(|p| p.plugin)
        .find(|p| p.is_fit_strategy())
        .unwrap_or(ScorePlugin::LeastAllocated)
}

fn apply_plugin_set(
    profile: &mut Profile,
    at: &str,
    set: &Value,
) -> Result<(), SchedulerConfigError> {
    let set = set.as_object().ok_or_else(|| refuse(at, "not a mapping"))?;
    for key in set.keys() {
        if key != "enabled" && key != "disabled" {
            return Err(refuse(format!("{at}.{key}"), "unknown field"));
        }
    }
    let list = |key: &str| -> Result<Vec<Value>, SchedulerConfigError> {
        match set.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items.clone()),
            Some(_) => Err(refuse(format!("{at}.{key}"), "not a list")),
        }
    };
    let name_of = |item: &Value, field: &str| -> Result<String, SchedulerConfigError> {
        item["name"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| refuse(format!("{field}.name"), "missing"))
    };
    for (i, item) in list("disabled")?.iter().enumerate() {
        let field = format!("{at}.disabled[{i}]");
        let name = name_of(item, &field)?;
        if name == "*" {
            profile.score_plugins.clear();
            continue;
        }
        if let Some(plugin) = score_plugin(&name, fit_strategy(profile), &format!("{field}.name"))?
        {
            profile.score_plugins.retain(|p| p.plugin != plugin);
        }
    }
    for (i, item) in list("enabled")?.iter().enumerate() {
        let field = format!("{at}.enabled[{i}]");
        let name = name_of(item, &field)?;
        let plugin = score_plugin(&name, fit_strategy(profile), &format!("{field}.name"))?
            .ok_or_else(|| {
                refuse(
                    format!("{field}.name"),
                    format!("gangway does not implement the score plugin \"{name}\"; leave it out or disable it"),
                )
            })?;
        // As kube-scheduler: an absent or zero weight is 1.
        let weight = match &item["weight"] {
            Value::Null => 1,
            w => w
                .as_u64()
                .and_then(|w| u32::try_from(w).ok())
                .ok_or_else(|| refuse(format!("{field}.weight"), format!("{w} is not a weight")))?
                .max(1),
        };
        match profile
            .score_plugins
            .iter_mut()
            .find(|p| p.plugin == plugin)
        {
            Some(p) => p.weight = weight,
            None => profile.score_plugins.push(PluginWeight { plugin, weight }),
        }
    }
    Ok(())
}

fn apply_plugin_config(
    profile: &mut Profile,
    at: &str,
    config: &Value,
) -> Result<(), SchedulerConfigError> {
    let name = config["name"]
        .as_str()
        .ok_or_else(|| refuse(format!("{at}.name"), "missing"))?;
    if name != "NodeResourcesFit" {
        return Err(refuse(
            format!("{at}.name"),
            format!("gangway takes arguments for NodeResourcesFit only, not \"{name}\""),
        ));
    }
    let args = config["args"]
        .as_object()
        .ok_or_else(|| refuse(format!("{at}.args"), "missing"))?;
    for key in args.keys() {
        if !["apiVersion", "kind", "scoringStrategy"].contains(&key.as_str()) {
            return Err(refuse(
                format!("{at}.args.{key}"),
                "not supported by gangway (it takes scoringStrategy only)",
            ));
        }
    }
    let Some(strategy) = args.get("scoringStrategy") else {
        return Ok(());
    };
    let at = format!("{at}.args.scoringStrategy");
    let fields = strategy
        .as_object()
        .ok_or_else(|| refuse(at.as_str(), "not a mapping"))?;
    for key in fields.keys() {
        if !["type", "resources", "requestedToCapacityRatio"].contains(&key.as_str()) {
            return Err(refuse(format!("{at}.{key}"), "unknown field"));
        }
    }
    let strategy = match fields.get("type").and_then(Value::as_str) {
        None | Some("LeastAllocated") => ScorePlugin::LeastAllocated,
        Some("MostAllocated") => ScorePlugin::MostAllocated,
        Some("RequestedToCapacityRatio") => ScorePlugin::RequestedToCapacityRatio,
        Some(other) => {
            return Err(refuse(
                format!("{at}.type"),
                format!(
                "\"{other}\": expected LeastAllocated, MostAllocated or RequestedToCapacityRatio"
            ),
            ))
        }
    };
    for p in profile.score_plugins.iter_mut() {
        if p.plugin.is_fit_strategy() {
            p.plugin = strategy;
        }
    }
    if let Some(resources) = fields.get("resources") {
        let list = resources
            .as_array()
            .ok_or_else(|| refuse(format!("{at}.resources"), "not a list"))?;
        profile.fit_resources = list
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let field = format!("{at}.resources[{i}]");
                let name = r["name"]
                    .as_str()
                    .ok_or_else(|| refuse(format!("{field}.name"), "missing"))?;
                let weight = match &r["weight"] {
                    Value::Null => 1,
                    w => w
                        .as_u64()
                        .and_then(|w| u32::try_from(w).ok())
                        .ok_or_else(|| {
                            refuse(format!("{field}.weight"), format!("{w} is not a weight"))
                        })?,
                };
                Ok(ResourceWeight {
                    name: name.to_string(),
                    weight,
                })
            })
            .collect::<Result<_, SchedulerConfigError>>()?;
    }
    if let Some(ratio) = fields.get("requestedToCapacityRatio") {
        if strategy != ScorePlugin::RequestedToCapacityRatio {
            return Err(refuse(
                format!("{at}.requestedToCapacityRatio"),
                "applies to type RequestedToCapacityRatio only",
            ));
        }
        let shape = ratio["shape"]
            .as_array()
            .ok_or_else(|| refuse(format!("{at}.requestedToCapacityRatio.shape"), "missing"))?;
        profile.shape = shape
            .iter()
            .enumerate()
            .map(|(i, point)| {
                let field = format!("{at}.requestedToCapacityRatio.shape[{i}]");
                let number = |key: &str| {
                    point[key]
                        .as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| {
                            refuse(format!("{field}.{key}"), "missing or not a whole number")
                        })
                };
                Ok(ShapePoint {
                    utilization: number("utilization")?,
                    score: number("score")?,
                })
            })
            .collect::<Result<_, SchedulerConfigError>>()?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "scheduler_config_tests.rs"]
mod tests;
