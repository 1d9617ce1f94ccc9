//! PodDisruptionBudgets as a preemption reads them (docs/ARCHITECTURE.md §5 rule 14):
//! the budgets the Kubernetes informers last saw, shared by the ingest loop (which
//! writes them on every replica) with the coordinator of the same replica (which reads
//! them when it chooses victims), and which budgets evicting a set of victims would
//! break. A preemption prefers victims that break none; only when no such set makes
//! room does it break one, and says so (a WARN naming the budgets and
//! `gangway_preemption_budget_violations_total`).
//!
//! Invariants: a budget is broken by a set of victim pods when more of them match it
//! (same namespace, selector) than its `status.disruptionsAllowed`; a budget with no
//! selector matches no pod, an empty selector every pod of its namespace (policy/v1).
//! Without Kubernetes (or before the informers listed PodDisruptionBudgets, or where
//! gangway may not read them) there are no budgets, and nothing is protected.

use std::sync::{Arc, RwLock};

use crate::ledger::meta::GroupRecord;
use crate::model::selectors::{label_selector_matches, Labels};
use crate::model::LabelSelector;

/// One PodDisruptionBudget, as far as preemption needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisruptionBudget {
    /// Its namespace (it protects pods of this namespace only).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The pods it protects; `None` (no selector) protects none.
    pub selector: Option<LabelSelector>,
    /// How many of them may be disrupted now (`status.disruptionsAllowed`).
    pub disruptions_allowed: u32,
}

impl DisruptionBudget {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn protects(&self, namespace: &str, labels: &Labels) -> bool {
        self.namespace == namespace
            && self
                .selector
                .as_ref()
                .is_some_and(|s| label_selector_matches(s, labels))
    }
}

/// The budgets last seen, shared between the ingest loop and the coordinator.
#[derive(Debug, Default)]
pub struct DisruptionBudgets {
    current: RwLock<Arc<Vec<DisruptionBudget>>>,
}

impl DisruptionBudgets {
    /// Replaces the budgets with `budgets`.
    pub fn replace(&self, budgets: Vec<DisruptionBudget>) {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        *current = Arc::new(budgets);
    }

    /// The budgets as last replaced.
    pub fn current(&self) -> Arc<Vec<DisruptionBudget>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The placed Kubernetes pods of a group (namespace, labels): what evicting it disrupts.
pub fn placed_pods(r: &GroupRecord) -> Vec<(&str, &Labels)> {
    r.group
        .gangs
        .iter()
        .flat_map(|g| {
            g.members
                .iter()
                .filter(|m| m.uid.is_some())
                .filter(|m| r.placements.contains_key(&g.member_key(m).to_string()))
                .map(|m| (g.namespace.as_str(), &m.spec.labels))
        })
        .collect()
}

/// The budgets that evicting `pods` (namespace, labels) would break, in their order.
pub fn broken<'a>(
    budgets: &'a [DisruptionBudget],
    pods: &[(&str, &Labels)],
) -> Vec<&'a DisruptionBudget> {
    budgets
        .iter()
        .filter(|b| {
            let disrupted = pods.iter().filter(|(ns, l)| b.protects(ns, l)).count();
            disrupted > b.disruptions_allowed as usize
        })
        .collect()
}

#[cfg(test)]
#[path = "budgets_tests.rs"]
mod tests;
