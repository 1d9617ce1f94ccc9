//! Each queue's usage over time: an average that forgets the past with a half-life,
//! for fair sharing over time (docs/ARCHITECTURE.md §5a, "Fair share over time").
//!
//! Owns [`UsageHistory`]: per queue and resource, the decayed usage `d`, advanced by
//! the coordinator's `SampleUsage` entries: over the `Δ` ms since the last sample,
//! `d ← d·k + u·(1 − k)` with `k = 2^(−Δ / half_life)` and `u` the queue's subtree
//! usage as the entry applies. So a queue that held `u` for one half-life has `d = u/2`,
//! and one that stopped using anything halves its `d` every half-life.
//!
//! Invariants: pure integer arithmetic (the decay factor from a fixed table, values in
//! 96-bit fixed point), so every replica applying the same entries holds the same bits;
//! time only from the entries (a sample older than the last one decays nothing); an
//! entry per deleted queue disappears at the next sample; `d` never exceeds the
//! largest usage sampled. Called by [`super::Queues`] only.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{ResourceName, Resources};

/// Shortest half-life a sample may name, in ms (0 turns fair sharing over time off).
pub const FAIR_SHARE_HALF_LIFE_MS_MIN: u64 = 1_000;
/// Longest half-life a sample may name, in ms (one year).
pub const FAIR_SHARE_HALF_LIFE_MS_MAX: u64 = 365 * 24 * 3_600 * 1_000;

/// One in the decay factor's fixed point (32 fractional bits).
const ONE_Q32: u64 = 1 << 32;

/// `2^(−2^−i)` for i = 1..=32, times 2^32, rounded to nearest: the factor for each
/// fractional bit of `Δ / half_life`.
const HALVING_ROOTS_Q32: [u64; 32] = [
    3037000500, 3611622603, 3938502376, 4112874773, 4202935003, 4248701965, 4271771996, 4283353945,
    4289156690, 4292061010, 4293513907, 4294240540, 4294603903, 4294785595, 4294876445, 4294921870,
    4294944583, 4294955939, 4294961618, 4294964457, 4294965876, 4294966586, 4294966941, 4294967119,
    4294967207, 4294967252, 4294967274, 4294967285, 4294967290, 4294967293, 4294967295, 4294967295,
];

/// What is kept of a value after `elapsed_ms` with `half_life_ms`: `2^(−elapsed /
/// half_life)` times 2^32, in integers only. `half_life_ms` must be above zero.
pub fn kept_q32(elapsed_ms: u64, half_life_ms: u64) -> u64 {
    let halvings = elapsed_ms / half_life_ms;
    if halvings >= 33 {
        return 0;
    }
    let rest = elapsed_ms % half_life_ms;
    // The fraction rest / half_life, with 32 bits after the point (below 2^32).
    let fraction = ((u128::from(rest) << 32) / u128::from(half_life_ms)) as u64;
    let mut kept = ONE_Q32;
    for (i, root) in HALVING_ROOTS_Q32.iter().enumerate() {
        if fraction & (1 << (31 - i)) != 0 {
            kept = ((u128::from(kept) * u128::from(*root)) >> 32) as u64;
        }
    }
    kept >> halvings
}

/// A decayed amount: the resource's unit with 32 bits after the point (so a queue's
/// slow growth under a long half-life is not rounded away), at most 2^96.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Decayed(u128);

impl Decayed {
    /// The whole units, rounded down.
    pub fn whole(self) -> u64 {
        (self.0 >> 32) as u64
    }

    /// `self·k + now·(1 − k)` for `k = kept / 2^32`.
    fn blend(self, now: u64, kept: u64) -> Self {
        let scaled = (self.0 >> 32) * u128::from(kept)
            + (((self.0 & u128::from(u32::MAX)) * u128::from(kept)) >> 32);
        Decayed(scaled + u128::from(now) * u128::from(ONE_Q32 - kept))
    }
}

impl Serialize for Decayed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ((self.0 >> 64) as u64, self.0 as u64).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Decayed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (high, low) = <(u64, u64)>::deserialize(d)?;
        Ok(Decayed((u128::from(high) << 64) | u128::from(low)))
    }
}

/// Every queue's decayed usage, and the sample it was last advanced by.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageHistory {
    /// The half-life the last sample named, in ms.
    half_life_ms: u64,
    /// The last sample's time (the proposer's clock), in ms.
    sampled_at_ms: u64,
    /// Queue → resource (its Kubernetes name) → decayed usage; zeros are left out.
    decayed: BTreeMap<String, BTreeMap<String, Decayed>>,
}

impl UsageHistory {
    /// A history that starts at `at_ms` with nothing used.
    pub fn starting(at_ms: u64, half_life_ms: u64) -> Self {
        Self {
            half_life_ms,
            sampled_at_ms: at_ms,
            decayed: BTreeMap::new(),
        }
    }

    /// The half-life of the last sample, in ms.
    pub fn half_life_ms(&self) -> u64 {
        self.half_life_ms
    }

    /// When the last sample was taken.
    pub fn sampled_at_ms(&self) -> u64 {
        self.sampled_at_ms
    }

    /// Advances every queue in `usage` (queue → subtree usage now; queues left out are
    /// forgotten) to `at_ms` with `half_life_ms`.
    pub fn sample(&mut self, at_ms: u64, half_life_ms: u64, usage: &BTreeMap<String, Resources>) {
        assert!(half_life_ms > 0, "a usage sample without a half-life");
        let elapsed = at_ms.saturating_sub(self.sampled_at_ms);
        let kept = kept_q32(elapsed, half_life_ms);
        let mut next = BTreeMap::new();
        for (queue, now) in usage {
            let before = self.decayed.get(queue);
            let mut names: Vec<ResourceName> = now.nonzero().map(|(r, _)| r).collect();
            names.extend(
                before
                    .into_iter()
                    .flat_map(|m| m.keys().map(|r| ResourceName::from_name(r))),
            );
            names.sort();
            names.dedup();
            let mut resources = BTreeMap::new();
            for name in names {
                let text = name.to_string();
                let old = before
                    .and_then(|m| m.get(&text))
                    .copied()
                    .unwrap_or_default();
                let new = old.blend(now.get(&name), kept);
                if new != Decayed::default() {
                    resources.insert(text, new);
                }
            }
            if !resources.is_empty() {
                next.insert(queue.clone(), resources);
            }
        }
        self.decayed = next;
        self.half_life_ms = half_life_ms;
        self.sampled_at_ms = self.sampled_at_ms.max(at_ms);
    }

    /// Queue `name`'s decayed usage in whole units.
    pub fn decayed(&self, name: &str) -> Resources {
        let mut out = Resources::zero();
        for (resource, amount) in self.decayed.get(name).into_iter().flatten() {
            out.set(&ResourceName::from_name(resource), amount.whole());
        }
        out
    }
}

#[cfg(test)]
#[path = "usage_history_tests.rs"]
mod tests;
