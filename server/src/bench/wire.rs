//! `gangway bench wire`: the replicated encoding alone, on one core, no Raft. The
//! commands of the engine's gang run (node registrations, then each gang's Reserve and
//! Commit) and the shard ledger's snapshot at its end are encoded and decoded in each
//! format of `wire`; prints bytes and time per item, best of several rounds.

use std::time::{Duration, Instant};

use anyhow::bail;

use gangway_core::engine::bench::gang_workload;
use gangway_core::ledger::{LedgerCommand, LedgerOp, ShardLedger};
use gangway_core::wire::{self, WireFormat};

/// Most nodes the benchmark builds.
pub const WIRE_NODES_MAX: usize = 200_000;
/// Most rounds (each encodes and decodes everything once per format).
pub const WIRE_ROUNDS_MAX: usize = 100;

/// Flags of `gangway bench wire`.
#[derive(Debug, clap::Args)]
pub struct WireBenchArgs {
    /// Nodes registered.
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Gangs placed (each one Reserve and one Commit).
    #[arg(long, default_value_t = 64)]
    pub gangs: usize,
    /// Members per gang.
    #[arg(long, default_value_t = 128)]
    pub members: usize,
    /// Rounds; the best of them is reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

/// One measured row.
struct Row {
    what: String,
    format: WireFormat,
    items: usize,
    bytes: usize,
    encode: Duration,
    decode: Duration,
}

/// The best times over `rounds` of `encode` and of `decode` on what it made, and the
/// bytes it made (each encoding a list of byte strings).
fn best_of(
    rounds: usize,
    mut encode: impl FnMut() -> anyhow::Result<Vec<Vec<u8>>>,
    mut decode: impl FnMut(&[Vec<u8>]) -> anyhow::Result<()>,
) -> anyhow::Result<(Duration, Duration, usize)> {
    let (mut encode_best, mut decode_best) = (Duration::MAX, Duration::MAX);
    let mut bytes = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let encoded = encode()?;
        encode_best = encode_best.min(t.elapsed());
        bytes = encoded.iter().map(Vec::len).sum();
        let t = Instant::now();
        decode(&encoded)?;
        decode_best = decode_best.min(t.elapsed());
    }
    Ok((encode_best, decode_best, bytes))
}

/// Encodes and decodes `items` in `format`, best of `rounds`.
fn measure(
    what: &str,
    items: &[&LedgerCommand],
    format: WireFormat,
    rounds: usize,
) -> anyhow::Result<Row> {
    let (encode, decode, bytes) = best_of(
        rounds,
        || {
            Ok(items
                .iter()
                .map(|c| format.encode(c))
                .collect::<Result<_, _>>()?)
        },
        |encoded| {
            for e in encoded {
                std::hint::black_box(wire::decode::<LedgerCommand>(e)?);
            }
            Ok(())
        },
    )?;
    Ok(Row {
        what: what.to_string(),
        format,
        items: items.len(),
        bytes,
        encode,
        decode,
    })
}

/// The ledger's snapshot in `format`, encoded and restored (restore also rebuilds the
/// indexes and checks every invariant, the same work in both formats), best of `rounds`.
fn measure_snapshot(
    ledger: &ShardLedger,
    format: WireFormat,
    rounds: usize,
) -> anyhow::Result<Row> {
    let (encode, decode, bytes) = best_of(
        rounds,
        || Ok(vec![ledger.snapshot_as(format)]),
        |encoded| {
            for e in encoded {
                std::hint::black_box(ShardLedger::restore(e)?);
            }
            Ok(())
        },
    )?;
    Ok(Row {
        what: "shard snapshot (restore)".into(),
        format,
        items: 1,
        bytes,
        encode,
        decode,
    })
}

fn per_item_us(d: Duration, items: usize) -> f64 {
    d.as_secs_f64() * 1e6 / items.max(1) as f64
}

/// Runs the benchmark and prints a markdown table.
pub fn run_bench(args: WireBenchArgs) -> anyhow::Result<()> {
    if args.nodes == 0 || args.nodes > WIRE_NODES_MAX {
        bail!("--nodes: {} is not in 1..={WIRE_NODES_MAX}", args.nodes);
    }
    if args.gangs == 0 || args.members == 0 {
        bail!("--gangs and --members must be >= 1");
    }
    if args.rounds == 0 || args.rounds > WIRE_ROUNDS_MAX {
        bail!("--rounds: {} is not in 1..={WIRE_ROUNDS_MAX}", args.rounds);
    }
    let (ledger, commands) = gang_workload(args.nodes, args.gangs, args.members);
    let of = |keep: fn(&LedgerOp) -> bool| -> Vec<&LedgerCommand> {
        commands.iter().filter(|c| keep(&c.op)).collect()
    };
    let groups = [
        (
            "node registration".to_string(),
            of(|op| matches!(op, LedgerOp::RegisterNode { .. })),
        ),
        (
            format!("Reserve of a {}-member gang", args.members),
            of(|op| matches!(op, LedgerOp::Reserve { .. })),
        ),
        (
            "Commit".to_string(),
            of(|op| matches!(op, LedgerOp::Commit { .. })),
        ),
    ];
    let mut rows = Vec::new();
    for (what, items) in &groups {
        if items.is_empty() {
            bail!("the workload placed no gang ({what}): give more --nodes");
        }
        for format in [WireFormat::Json, WireFormat::Binary] {
            rows.push(measure(what, items, format, args.rounds)?);
        }
    }
    for format in [WireFormat::Json, WireFormat::Binary] {
        rows.push(measure_snapshot(&ledger, format, args.rounds)?);
    }
    println!(
        "{} nodes, {} gangs of {} members; best of {} rounds",
        args.nodes, args.gangs, args.members, args.rounds
    );
    println!();
    println!(
        "| item | format | items | bytes per item | encode µs per item | decode µs per item |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} |",
            r.what,
            r.format.name(),
            r.items,
            r.bytes / r.items.max(1),
            per_item_us(r.encode, r.items),
            per_item_us(r.decode, r.items)
        );
    }
    println!();
    println!("Binary against JSON (same run):");
    for pair in rows.chunks(2) {
        let [json, binary] = pair else { continue };
        println!(
            "- {}: bytes ×{:.2}, encode ×{:.2}, decode ×{:.2}",
            json.what,
            binary.bytes as f64 / json.bytes.max(1) as f64,
            binary.encode.as_secs_f64() / json.encode.as_secs_f64().max(1e-12),
            binary.decode.as_secs_f64() / json.decode.as_secs_f64().max(1e-12)
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
