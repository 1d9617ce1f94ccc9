//! `gangctl`: the command line for people. Exit codes a script can trust:
//! 0 success, 1 the server refused or failed the request, 2 bad usage,
//! 3 no replica could be reached.

use clap::{Parser, Subcommand, ValueEnum};
use gangway_client::{Client, ClientError};
use serde_json::json;

/// Command-line client for gangway.
#[derive(Parser)]
#[command(name = "gangctl", version, about)]
struct Cli {
    /// Replica addresses to try, comma-separated.
    #[arg(
        long,
        short = 's',
        env = "GANGWAY_SERVER",
        default_value = "127.0.0.1:7070",
        value_delimiter = ','
    )]
    server: Vec<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Cluster membership and Raft groups.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// List registered nodes.
    Nodes {
        /// Only this shard.
        #[arg(long)]
        shard: Option<u32>,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Every replica's view of every group.
    Status,
    /// Spread group leaderships evenly over the live replicas.
    Balance,
    /// Snapshot and truncate the connected replica's logs.
    Compact {
        /// Only this group.
        #[arg(long)]
        group: Option<u64>,
    },
}

async fn run(cli: Cli) -> Result<(), ClientError> {
    let client = Client::connect(&cli.server).await?;
    match cli.command {
        Command::Cluster {
            command: ClusterCommand::Status,
        } => cluster_status(&client, cli.output).await,
        Command::Cluster {
            command: ClusterCommand::Balance,
        } => {
            let reply = client.balance().await?;
            match cli.output {
                Output::Json => {
                    let moves: Vec<_> = reply
                        .transfers
                        .iter()
                        .map(|t| json!({"group": t.group_id, "from": t.from_node, "to": t.to_node, "done": t.done}))
                        .collect();
                    println!(
                        "{}",
                        json!({"transfers": moves, "leaders_per_node": reply.leaders_per_node})
                    );
                }
                Output::Table => {
                    println!("{:<6} {:<5} {:<5} DONE", "GROUP", "FROM", "TO");
                    for t in &reply.transfers {
                        println!(
                            "{:<6} {:<5} {:<5} {}",
                            t.group_id, t.from_node, t.to_node, t.done
                        );
                    }
                    println!("leaders per node: {:?}", reply.leaders_per_node);
                }
            }
            Ok(())
        }
        Command::Cluster {
            command: ClusterCommand::Compact { group },
        } => {
            client.compact(group).await?;
            println!("compacted on {}", client.addr());
            Ok(())
        }
        Command::Nodes { shard } => {
            let nodes = client.list_nodes(shard).await?;
            match cli.output {
                Output::Json => {
                    let list: Vec<_> = nodes
                        .iter()
                        .filter_map(|n| {
                            let s = n.node.as_ref()?;
                            Some(json!({"name": s.name, "shard": n.shard, "labels": s.labels, "allocatable": s.allocatable}))
                        })
                        .collect();
                    println!("{}", json!(list));
                }
                Output::Table => {
                    println!("{:<32} {:<6} ALLOCATABLE", "NAME", "SHARD");
                    for n in &nodes {
                        if let Some(s) = &n.node {
                            let mut alloc: Vec<_> = s
                                .allocatable
                                .iter()
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect();
                            alloc.sort();
                            println!("{:<32} {:<6} {}", s.name, n.shard, alloc.join(","));
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

async fn cluster_status(client: &Client, output: Output) -> Result<(), ClientError> {
    let all = client.cluster_status().await?;
    if let Output::Json = output {
        let list: Vec<_> = all
            .iter()
            .map(|(id, addr, s)| match s {
                Ok(s) => json!({"node": id, "addr": addr, "groups": s.groups.iter().map(|g| json!({
                    "group": g.group_id, "role": g.role, "leader": g.leader, "term": g.term,
                    "committed": g.committed_index, "applied": g.applied_index, "voters": g.voters, "learners": g.learners
                })).collect::<Vec<_>>()}),
                Err(e) => json!({"node": id, "addr": addr, "error": e.to_string()}),
            })
            .collect();
        println!("{}", json!(list));
        return Ok(());
    }
    println!(
        "{:<5} {:<22} {:<6} {:<10} {:<7} {:<6} {:<10} {:<10} VOTERS",
        "NODE", "ADDR", "GROUP", "ROLE", "LEADER", "TERM", "COMMITTED", "APPLIED"
    );
    for (id, addr, s) in &all {
        match s {
            Ok(s) => {
                for g in &s.groups {
                    println!(
                        "{:<5} {:<22} {:<6} {:<10} {:<7} {:<6} {:<10} {:<10} {:?}",
                        id,
                        addr,
                        g.group_id,
                        g.role,
                        g.leader,
                        g.term,
                        g.committed_index,
                        g.applied_index,
                        g.voters
                    );
                }
            }
            Err(e) => println!("{id:<5} {addr:<22} unreachable: {e}"),
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("gangctl: error: {e}");
        std::process::exit(match e {
            ClientError::Connect { .. } => 3,
            ClientError::Rpc(_) => 1,
        });
    }
}
