//! Unit tests of `budgets.rs`.

use super::*;

fn labels(app: &str) -> Labels {
    [("app".to_string(), app.to_string())].into_iter().collect()
}

fn budget(namespace: &str, app: Option<&str>, allowed: u32) -> DisruptionBudget {
    DisruptionBudget {
        namespace: namespace.into(),
        name: format!("pdb-{}", app.unwrap_or("none")),
        selector: app.map(|a| LabelSelector {
            match_labels: labels(a),
            match_expressions: Vec::new(),
        }),
        disruptions_allowed: allowed,
    }
}

#[test]
fn a_budget_breaks_only_past_its_allowance_in_its_namespace() {
    let web = labels("web");
    let db = labels("db");
    let budgets = vec![budget("a", Some("web"), 1), budget("a", None, 0)];
    assert!(
        broken(&budgets, &[("a", &web)]).is_empty(),
        "one of one allowed"
    );
    let two = broken(&budgets, &[("a", &web), ("a", &web)]);
    assert_eq!(
        two.iter().map(|b| b.id()).collect::<Vec<_>>(),
        ["a/pdb-web"]
    );
    assert!(
        broken(&budgets, &[("b", &web), ("b", &web), ("a", &db)]).is_empty(),
        "other namespaces and labels, and a budget without selector, protect nothing"
    );
}

#[test]
fn an_empty_selector_protects_every_pod_of_its_namespace() {
    let mut all = budget("a", None, 0);
    all.selector = Some(LabelSelector::default());
    let web = labels("web");
    assert_eq!(broken(&[all], &[("a", &web)]).len(), 1);
}

#[test]
fn the_shared_budgets_are_replaced_whole() {
    let shared = DisruptionBudgets::default();
    assert!(shared.current().is_empty());
    shared.replace(vec![budget("a", Some("web"), 0)]);
    assert_eq!(shared.current().len(), 1);
    shared.replace(Vec::new());
    assert!(shared.current().is_empty());
}
