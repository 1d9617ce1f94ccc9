//! Unit tests of `profile.rs`.

use super::*;

#[test]
fn default_profile_is_valid() {
    assert_eq!(Profile::default().validate(), Ok(()));
    let json = serde_json::to_string(&Profile::default()).unwrap_or_default();
    let back: Profile = serde_json::from_str(&json).unwrap_or_else(|_| Profile {
        score_plugins: Vec::new(),
        ..Profile::default()
    });
    assert_eq!(back, Profile::default());
}

#[test]
fn bad_profiles_name_the_field() {
    let mut p = Profile::default();
    p.score_plugins.push(PluginWeight {
        plugin: ScorePlugin::MostAllocated,
        weight: 1,
    });
    let err = p.validate().map_err(|e| e.to_string());
    assert!(
        matches!(&err, Err(m) if m.starts_with("scorePlugins[6]: at most one of")),
        "{err:?}"
    );

    let mut p = Profile::default();
    p.score_plugins[0].weight = 0;
    assert_eq!(
        p.validate().map_err(|e| e.path),
        Err("scorePlugins[0].weight".to_string())
    );

    let p = Profile {
        shape: vec![
            ShapePoint {
                utilization: 50,
                score: 1,
            },
            ShapePoint {
                utilization: 50,
                score: 2,
            },
        ],
        ..Profile::default()
    };
    assert_eq!(
        p.validate().map_err(|e| e.path),
        Err("shape[1].utilization".to_string())
    );

    let mut p = Profile::default();
    p.shape[1].score = 11;
    assert_eq!(
        p.validate().map_err(|e| e.path),
        Err("shape[1].score".to_string())
    );

    let mut p = Profile::default();
    p.fit_resources[0].name = "gpu".into();
    assert_eq!(
        p.validate().map_err(|e| e.path),
        Err("fitResources[0].name".to_string())
    );

    let unknown = serde_json::from_str::<PluginWeight>(r#"{"plugin": "Spread", "weight": 1}"#);
    assert!(unknown.is_err());

    let p = Profile {
        percentage_of_nodes_to_score: 101,
        topologies: Vec::new(),
        ..Profile::default()
    };
    assert_eq!(
        p.validate().map_err(|e| e.path),
        Err("percentageOfNodesToScore".to_string())
    );
}

#[test]
fn percentage_of_nodes_to_score_is_optional_in_json() {
    let mut json = serde_json::to_value(Profile::default()).unwrap_or_default();
    assert_eq!(json["percentageOfNodesToScore"], 0);
    if let Some(fields) = json.as_object_mut() {
        fields.remove("percentageOfNodesToScore");
    }
    let back: Option<Profile> = serde_json::from_value(json).ok();
    assert_eq!(back, Some(Profile::default()));
}
