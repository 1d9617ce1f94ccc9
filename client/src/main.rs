//! `gangctl`: the command line for people. Exit codes a script can trust:
//! 0 success, 1 the server refused or failed the request, 2 bad usage or a bad
//! group file, 3 no replica could be reached, 4 `watch` saw the group end
//! without reaching the state it waited for.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use gangway_client::api::GangGroupStatus;
use gangway_client::spec::{self, SpecError};
use gangway_client::{Client, ClientError, Credentials};
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
    /// PEM CA that signed the servers' certificates (servers run with --tls-*).
    #[arg(long, env = "GANGWAY_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// PEM client certificate (mutual TLS), with --tls-key.
    #[arg(long, env = "GANGWAY_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(long, env = "GANGWAY_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Bearer token (servers run with --auth-tokens-file); prefer the environment variable.
    #[arg(long, env = "GANGWAY_TOKEN", hide_env_values = true)]
    token: Option<String>,
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
    /// Submit a gang group from a YAML file.
    Submit {
        /// The group file (see `gangway_client::spec` for the format); `-` reads stdin.
        #[arg(long, short = 'f')]
        file: String,
        /// Idempotency key (overrides the file's).
        #[arg(long)]
        key: Option<String>,
    },
    /// Show one gang group.
    Get {
        /// Gang group id.
        id: u64,
    },
    /// List gang groups.
    List {
        /// Include finished groups.
        #[arg(long)]
        all: bool,
    },
    /// Follow a gang group's state changes.
    Watch {
        /// Gang group id.
        id: u64,
        /// Stop when the group reaches this state (exit 4 if it ends elsewhere).
        #[arg(long)]
        until: Option<String>,
    },
    /// Cancel a gang group; whatever it holds is released.
    Cancel {
        /// Gang group id.
        id: u64,
    },
    /// Release a placed gang group whose work finished (or only some of its members).
    Release {
        /// Gang group id.
        id: u64,
        /// Release only this member (namespace/gang/member); repeat for several.
        #[arg(long = "member")]
        members: Vec<String>,
    },
    /// Shards with their leaders, nodes, domains and capacity (`shards move` and
    /// `shards rebalance` move nodes between them).
    Shards {
        #[command(subcommand)]
        command: Option<ShardsCommand>,
    },
    /// Cluster membership and Raft groups.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// List registered nodes (devices as held/usable/total; usable: healthy and offered).
    Nodes {
        /// Only this shard.
        #[arg(long)]
        shard: Option<u32>,
    },
    /// Queues with their usage against min and max (`queues put` / `queues delete` change them).
    Queues {
        #[command(subcommand)]
        command: Option<QueuesCommand>,
    },
}

#[derive(Subcommand)]
enum ShardsCommand {
    /// Move a topology domain's nodes (or single nodes) to another shard.
    Move {
        /// The domain (the value of the topology label), e.g. `zone-a`.
        domain: Option<String>,
        /// Move this node instead of a domain; repeat for several.
        #[arg(long = "node")]
        nodes: Vec<String>,
        /// The target shard.
        #[arg(long)]
        to: u32,
        /// Return once the move is recorded, not once it ended.
        #[arg(long)]
        no_wait: bool,
    },
    /// Move nodes until no shard holds more than the bound over the mean capacity.
    Rebalance {
        /// The bound in percent of the mean (default: the server's, 125).
        #[arg(long, default_value_t = 0)]
        bound_percent: u32,
        /// Show the plan only.
        #[arg(long)]
        dry_run: bool,
    },
    /// The running move and the last finished ones.
    Moves,
    /// Nodes held for the gang groups at the head of the line (`--head-reservations`).
    Reservations,
    /// Raise the live cluster's shard count (it never falls). The added shards start
    /// empty; `shards rebalance` (or the automatic rebalancing) moves nodes onto them.
    Grow {
        /// The new count, above the current one and at most 256.
        #[arg(long)]
        to: u32,
    },
}

#[derive(Subcommand)]
enum QueuesCommand {
    /// Create or change a queue.
    Put {
        /// Its name (a DNS label).
        name: String,
        /// Its parent queue (none: a top-level queue).
        #[arg(long, default_value = "")]
        parent: String,
        /// Its share among siblings, 1..=1000.
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// Guaranteed amounts, e.g. `cpu=16,memory=64Gi,nvidia.com/gpu=4`.
        #[arg(long, default_value = "", value_parser = parse_amounts)]
        min: Amounts,
        /// Ceilings, borrowing included, in the same form (a resource not named: no limit).
        #[arg(long, default_value = "", value_parser = parse_amounts)]
        max: Amounts,
        /// Lending limits: how much of each `min` others may borrow while the queue is
        /// idle, in the same form (a resource not named: all of it).
        #[arg(long, default_value = "", value_parser = parse_amounts)]
        lend: Amounts,
        /// A Kubernetes namespace whose pods may name this queue with the label
        /// scheduling.gangway.dev/queue (repeatable; `*` for every namespace).
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
    },
    /// Delete a queue with no children and no gang group that has not ended.
    Delete {
        /// Its name.
        name: String,
    },
}

/// `name=quantity` pairs from the command line.
#[derive(Clone, Debug, Default)]
struct Amounts(std::collections::HashMap<String, String>);

fn parse_amounts(text: &str) -> Result<Amounts, String> {
    let mut out = std::collections::HashMap::new();
    for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((name, amount)) = pair.split_once('=') else {
            return Err(format!("{pair:?} is not NAME=QUANTITY (e.g. cpu=16)"));
        };
        out.insert(name.trim().to_string(), amount.trim().to_string());
    }
    Ok(Amounts(out))
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
    /// Add a replica (started with `gangway serve --join`) as a voter of every group.
    Add {
        /// Its node id (new: never one a lost replica had).
        #[arg(long)]
        id: u64,
        /// The address peers reach it at (its --advertise).
        #[arg(long)]
        addr: String,
    },
    /// Remove a replica from every group (its leaderships move away first).
    Remove {
        /// Its node id.
        #[arg(long)]
        id: u64,
    },
}

fn move_json(m: &gangway_proto::admin::ShardMove) -> serde_json::Value {
    let sources: Vec<_> = m
        .sources
        .iter()
        .map(|s| json!({"shard": s.shard, "nodes": s.nodes}))
        .collect();
    json!({"id": m.id, "to": m.to, "sources": sources, "phase": m.phase, "reason": m.reason, "begun_at_ms": m.begun_at_ms, "ended_at_ms": m.ended_at_ms})
}

fn print_moves(moves: &[gangway_proto::admin::ShardMove], output: Output) {
    match output {
        Output::Json => println!("{}", json!(moves.iter().map(move_json).collect::<Vec<_>>())),
        Output::Table => {
            println!(
                "{:<5} {:<10} {:<5} {:<12} {:<6} REASON",
                "MOVE", "PHASE", "TO", "FROM", "NODES"
            );
            for m in moves {
                let from: Vec<String> = m.sources.iter().map(|s| s.shard.to_string()).collect();
                let nodes: usize = m.sources.iter().map(|s| s.nodes.len()).sum();
                println!(
                    "{:<5} {:<10} {:<5} {:<12} {:<6} {}",
                    m.id,
                    m.phase,
                    m.to,
                    from.join(","),
                    nodes,
                    m.reason
                );
            }
        }
    }
}

fn print_reservations(reservations: &[gangway_proto::admin::HeadReservation], output: Output) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let in_s = |at: u64| at.saturating_sub(now).div_ceil(1_000);
    match output {
        Output::Json => {
            let rows: Vec<_> = reservations
                .iter()
                .map(|r| {
                    let nodes: serde_json::Map<String, serde_json::Value> = r
                        .nodes
                        .iter()
                        .map(|s| (s.shard.to_string(), json!(s.nodes)))
                        .collect();
                    json!({"group": r.group, "priority": r.priority, "nodes": nodes,
                        "starts_by_ms": (r.starts_by_ms > 0).then_some(r.starts_by_ms),
                        "made_at_ms": r.made_at_ms, "expires_at_ms": r.expires_at_ms})
                })
                .collect();
            println!("{}", json!(rows));
        }
        Output::Table => {
            println!(
                "{:<7} {:<9} {:<7} {:<11} {:<11} SHARDS",
                "GROUP", "PRIORITY", "NODES", "STARTS-IN", "EXPIRES-IN"
            );
            for r in reservations {
                let nodes: usize = r.nodes.iter().map(|s| s.nodes.len()).sum();
                let shards: Vec<String> = r.nodes.iter().map(|s| s.shard.to_string()).collect();
                let starts = match r.starts_by_ms {
                    0 => "unknown".to_string(),
                    at => format!("{}s", in_s(at)),
                };
                println!(
                    "{:<7} {:<9} {:<7} {:<11} {:<11} {}",
                    r.group,
                    r.priority,
                    nodes,
                    starts,
                    format!("{}s", in_s(r.expires_at_ms)),
                    shards.join(",")
                );
            }
        }
    }
}

/// Why gangctl failed, and so its exit code.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Spec(#[from] SpecError),
    #[error("{0}")]
    Usage(String),
    #[error("gang group {id} ended {state}, not {wanted}")]
    WrongEnd {
        id: u64,
        state: String,
        wanted: String,
    },
}

impl Failure {
    fn exit_code(&self) -> i32 {
        match self {
            Failure::Client(ClientError::Connect { .. }) => 3,
            Failure::Client(ClientError::Rpc(_)) => 1,
            Failure::Spec(_) | Failure::Usage(_) | Failure::Client(ClientError::Credentials(_)) => {
                2
            }
            Failure::WrongEnd { .. } => 4,
        }
    }
}

fn print_voters(voters: &[(u64, Vec<u64>)], output: Output) {
    match output {
        Output::Json => {
            let list: Vec<_> = voters
                .iter()
                .map(|(g, v)| json!({"group": g, "voters": v}))
                .collect();
            println!("{}", json!({ "groups": list }));
        }
        Output::Table => {
            println!("{:<6} VOTERS", "GROUP");
            for (g, v) in voters {
                println!("{g:<6} {v:?}");
            }
        }
    }
}

fn print_group(s: &GangGroupStatus, output: Output) {
    match output {
        Output::Json => {
            let placements: Vec<_> = s
                .placements
                .iter()
                .map(|p| json!({"namespace": p.namespace, "gang": p.gang, "member": p.member, "node": p.node, "shard": p.shard}))
                .collect();
            let spread: serde_json::Map<String, serde_json::Value> = s
                .spread
                .iter()
                .map(|d| (d.key.clone(), json!(d.domains)))
                .collect();
            println!(
                "{}",
                json!({"id": s.id, "name": s.name, "key": s.idempotency_key, "state": s.state, "reason": s.reason,
                       "attempts": s.attempts, "members": s.members, "gangs": s.gangs, "placements": placements,
                       "version": s.version, "queue": s.queue, "owner": s.owner, "spread": spread})
            );
        }
        Output::Table => {
            print_groups(std::slice::from_ref(s), output);
            for d in &s.spread {
                println!(
                    "  {}: {} ({})",
                    d.key,
                    d.domains.len(),
                    d.domains.join(", ")
                );
            }
        }
    }
}

fn print_groups(list: &[GangGroupStatus], output: Output) {
    match output {
        Output::Json => list.iter().for_each(|s| print_group(s, output)),
        Output::Table => {
            println!(
                "{:<6} {:<24} {:<10} {:<8} {:<8} {:<16} {:<16} REASON",
                "ID", "NAME", "STATE", "MEMBERS", "PLACED", "QUEUE", "OWNER"
            );
            let or_dash = |v: &str| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.to_string()
                }
            };
            for s in list {
                let placed = s.placements.len();
                println!(
                    "{:<6} {:<24} {:<10} {:<8} {:<8} {:<16} {:<16} {}",
                    s.id,
                    s.name,
                    s.state,
                    s.members,
                    placed,
                    or_dash(&s.queue),
                    or_dash(&s.owner),
                    s.reason
                );
            }
        }
    }
}

fn read_file(path: &str) -> Result<String, Failure> {
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    };
    text.map_err(|e| Failure::Usage(format!("--file {path}: {e}")))
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let request = match &cli.command {
        Command::Submit { file, key } => {
            let mut req = spec::from_yaml(&read_file(file)?)?;
            if let Some(k) = key {
                req.idempotency_key = k.clone();
            }
            Some(req)
        }
        _ => None,
    };
    let credentials = Credentials::from_files(
        cli.tls_ca.as_deref(),
        cli.tls_cert.as_deref(),
        cli.tls_key.as_deref(),
        cli.token.clone(),
    )?;
    let client = Client::connect_with(&cli.server, credentials).await?;
    match cli.command {
        Command::Submit { .. } => {
            let Some(req) = request else { return Ok(()) };
            print_group(&client.submit(req).await?, cli.output);
            Ok(())
        }
        Command::Get { id } => {
            print_group(&client.get(id).await?, cli.output);
            Ok(())
        }
        Command::List { all } => {
            print_groups(&client.list_groups(all).await?, cli.output);
            Ok(())
        }
        Command::Watch { id, until } => {
            let output = cli.output;
            let last = client
                .watch_until(id, |s| {
                    match output {
                        Output::Json => print_group(s, output),
                        Output::Table => println!(
                            "{:<6} {:<10} placed {}/{} {}",
                            s.id,
                            s.state,
                            s.placements.len(),
                            s.members,
                            s.reason
                        ),
                    }
                    until.as_deref() == Some(s.state.as_str())
                })
                .await?;
            match until {
                Some(wanted) if wanted != last.state => Err(Failure::WrongEnd {
                    id,
                    state: last.state,
                    wanted,
                }),
                _ => Ok(()),
            }
        }
        Command::Cancel { id } => {
            print_group(&client.cancel(id).await?, cli.output);
            Ok(())
        }
        Command::Release { id, members } => {
            let status = if members.is_empty() {
                client.release(id).await?
            } else {
                client.release_members(id, members).await?
            };
            print_group(&status, cli.output);
            Ok(())
        }
        Command::Shards { command: None } => {
            let shards = client.shards().await?;
            match cli.output {
                Output::Json => {
                    let list: Vec<_> = shards
                        .iter()
                        .map(|s| json!({"shard": s.shard, "leader": s.leader, "voters": s.voters, "nodes": s.nodes, "domains": s.domains, "homes": s.homes, "capacity_milli_cpu": s.capacity_milli_cpu}))
                        .collect();
                    println!("{}", json!(list));
                }
                Output::Table => {
                    println!(
                        "{:<6} {:<7} {:<6} {:<10} {:<12} DOMAINS",
                        "SHARD", "LEADER", "NODES", "CPU", "VOTERS"
                    );
                    for s in &shards {
                        let mut domains: Vec<String> = s
                            .domains
                            .iter()
                            .map(|(d, n)| {
                                let home = if s.homes.contains(d) { "*" } else { "" };
                                format!("{d}{home}={n}")
                            })
                            .collect();
                        domains.sort();
                        println!(
                            "{:<6} {:<7} {:<6} {:<10} {:<12} {}",
                            s.shard,
                            s.leader,
                            s.nodes,
                            s.capacity_milli_cpu / 1000,
                            format!("{:?}", s.voters),
                            domains.join(",")
                        );
                    }
                }
            }
            Ok(())
        }
        Command::Shards {
            command:
                Some(ShardsCommand::Move {
                    domain,
                    nodes,
                    to,
                    no_wait,
                }),
        } => {
            if domain.is_some() == !nodes.is_empty() {
                return Err(Failure::Usage(
                    "name a domain or --node NAME (one or several), not both".into(),
                ));
            }
            let reply = client.move_nodes(domain, nodes, to, !no_wait).await?;
            let m = reply.shard_move.unwrap_or_default();
            print_moves(std::slice::from_ref(&m), cli.output);
            if reply.left > 0 {
                eprintln!(
                    "{} more node(s) of the domain are left: run the same move again",
                    reply.left
                );
            }
            match m.phase.as_str() {
                "cancelled" => Err(Failure::Usage(format!(
                    "the move was given up: {}",
                    m.reason
                ))),
                _ => Ok(()),
            }
        }
        Command::Shards {
            command:
                Some(ShardsCommand::Rebalance {
                    bound_percent,
                    dry_run,
                }),
        } => {
            let reply = client.rebalance(bound_percent, dry_run).await?;
            match cli.output {
                Output::Json => {
                    let plan: Vec<_> = reply
                        .plan
                        .iter()
                        .map(|p| json!({"from": p.from, "to": p.to, "nodes": p.nodes, "weight": p.weight}))
                        .collect();
                    println!(
                        "{}",
                        json!({"peak_percent_before": reply.peak_percent_before, "peak_percent_after": reply.peak_percent_after, "plan": plan, "moves": reply.moves.iter().map(move_json).collect::<Vec<_>>()})
                    );
                }
                Output::Table => {
                    for p in &reply.plan {
                        println!(
                            "plan: {} node(s) from shard {} to shard {} ({} cpu)",
                            p.nodes.len(),
                            p.from,
                            p.to,
                            p.weight / 1000
                        );
                    }
                    if !reply.moves.is_empty() {
                        print_moves(&reply.moves, cli.output);
                    }
                    println!(
                        "heaviest shard: {}% of the mean capacity before, {}% after",
                        reply.peak_percent_before, reply.peak_percent_after
                    );
                }
            }
            Ok(())
        }
        Command::Shards {
            command: Some(ShardsCommand::Grow { to }),
        } => {
            let reply = client.grow_shards(to).await?;
            match cli.output {
                Output::Json => println!(
                    "{}",
                    json!({"shards_before": reply.shards_before, "shards": reply.shards, "ready": reply.ready, "not_ready": reply.not_ready})
                ),
                Output::Table => {
                    println!("shards: {} -> {}", reply.shards_before, reply.shards);
                    if !reply.not_ready.is_empty() {
                        println!(
                            "still electing a leader: {:?} (see `gangctl shards`)",
                            reply.not_ready
                        );
                    }
                    if reply.shards > reply.shards_before {
                        println!("the added shards are empty: `gangctl shards rebalance` moves nodes onto them");
                    }
                }
            }
            Ok(())
        }
        Command::Shards {
            command: Some(ShardsCommand::Moves),
        } => {
            print_moves(&client.shard_moves().await?, cli.output);
            Ok(())
        }
        Command::Shards {
            command: Some(ShardsCommand::Reservations),
        } => {
            print_reservations(&client.reservations().await?, cli.output);
            Ok(())
        }
        Command::Cluster {
            command: ClusterCommand::Status,
        } => Ok(cluster_status(&client, cli.output).await?),
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
            command: ClusterCommand::Add { id, addr },
        } => {
            let voters = client.add_member(id, &addr).await?;
            print_voters(&voters, cli.output);
            Ok(())
        }
        Command::Cluster {
            command: ClusterCommand::Remove { id },
        } => {
            let voters = client.remove_member(id).await?;
            print_voters(&voters, cli.output);
            Ok(())
        }
        Command::Cluster {
            command: ClusterCommand::Compact { group },
        } => {
            client.compact(group).await?;
            println!("compacted on {}", client.addr());
            Ok(())
        }
        Command::Queues { command } => Ok(queues(&client, command, cli.output).await?),
        Command::Nodes { shard } => {
            let nodes = client.list_nodes(shard).await?;
            match cli.output {
                Output::Json => {
                    let list: Vec<_> = nodes
                        .iter()
                        .filter_map(|n| {
                            let s = n.node.as_ref()?;
                            let devices: Vec<_> = n
                                .devices
                                .iter()
                                .map(|d| {
                                    json!({
                                        "driver": d.driver, "pool": d.pool, "name": d.name,
                                        "unhealthy": d.unhealthy, "heldBy": d.held_by,
                                        "withdrawn": d.withdrawn,
                                    })
                                })
                                .collect();
                            Some(json!({
                                "name": s.name, "shard": n.shard, "labels": s.labels,
                                "allocatable": s.allocatable, "notReady": s.not_ready,
                                "pods": n.pods, "devices": devices, "agent": n.agent,
                                "leaseUntilMs": n.lease_until_ms,
                            }))
                        })
                        .collect();
                    println!("{}", json!(list));
                }
                Output::Table => {
                    println!(
                        "{:<32} {:<6} {:<9} {:<5} {:<14} ALLOCATABLE",
                        "NAME", "SHARD", "READY", "PODS", "DEVICES"
                    );
                    for n in &nodes {
                        if let Some(s) = &n.node {
                            let mut alloc: Vec<_> = s
                                .allocatable
                                .iter()
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect();
                            alloc.sort();
                            let ready = if s.not_ready { "NotReady" } else { "Ready" };
                            println!(
                                "{:<32} {:<6} {:<9} {:<5} {:<14} {}",
                                s.name,
                                n.shard,
                                ready,
                                n.pods,
                                device_summary(n),
                                alloc.join(",")
                            );
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

async fn queues(
    client: &Client,
    command: Option<QueuesCommand>,
    output: Output,
) -> Result<(), ClientError> {
    match command {
        Some(QueuesCommand::Put {
            name,
            parent,
            weight,
            min,
            max,
            lend,
            namespaces,
        }) => {
            let spec = gangway_client::admin_api::QueueSpec {
                name,
                parent,
                weight,
                min: min.0,
                max: max.0,
                lend: lend.0,
                managed_by: String::new(),
                namespaces,
            };
            let status = client.put_queue(spec).await?;
            print_queues(&[status], &Default::default(), 0, output);
        }
        Some(QueuesCommand::Delete { name }) => {
            client.delete_queue(&name).await?;
            println!("queue {name} deleted");
        }
        None => {
            let list = client.queue_list().await?;
            print_queues(
                &list.queues,
                &list.capacity,
                list.fair_share_half_life_ms,
                output,
            )
        }
    }
    Ok(())
}

/// Queues as a table (usage/max per resource named in min, max or usage; `-`: no
/// limit; the min, and what of it the queue lends when it names a limit; the decayed
/// usage while fair sharing over time is on), then the cluster's capacity when
/// recorded and the fair-share half-life when set; or as JSON.
fn print_queues(
    queues: &[gangway_client::admin_api::QueueStatus],
    capacity: &std::collections::HashMap<String, String>,
    half_life_ms: u64,
    output: Output,
) {
    if let Output::Json = output {
        let list: Vec<_> = queues
            .iter()
            .map(|q| {
                let spec = q.spec.clone().unwrap_or_default();
                json!({
                    "name": spec.name, "parent": spec.parent, "weight": spec.weight,
                    "min": spec.min, "max": spec.max, "lend": spec.lend, "usage": q.usage,
                    "queued": q.queued, "admitted": q.admitted, "managedBy": spec.managed_by,
                    "decayedUsage": q.decayed_usage,
                })
            })
            .collect();
        println!("{}", json!(list));
        return;
    }
    println!(
        "{:<20} {:<20} {:<6} {:<7} {:<8} USAGE/MAX (MIN)",
        "NAME", "PARENT", "WEIGHT", "QUEUED", "ADMITTED"
    );
    for q in queues {
        let spec = q.spec.clone().unwrap_or_default();
        let mut names: Vec<&String> = spec
            .min
            .keys()
            .chain(spec.max.keys())
            .chain(q.usage.keys())
            .collect();
        names.sort();
        names.dedup();
        let cells: Vec<String> = names
            .iter()
            .map(|n| {
                let used = q.usage.get(*n).map_or("0", String::as_str);
                let max = spec.max.get(*n).map_or("-", String::as_str);
                match (spec.min.get(*n), spec.lend.get(*n)) {
                    (Some(min), Some(lend)) => format!("{n}={used}/{max} ({min}, lends {lend})"),
                    (Some(min), None) => format!("{n}={used}/{max} ({min})"),
                    (None, _) => format!("{n}={used}/{max}"),
                }
            })
            .collect();
        let parent = if spec.parent.is_empty() {
            "-"
        } else {
            spec.parent.as_str()
        };
        let mut decayed: Vec<String> = q
            .decayed_usage
            .iter()
            .map(|(n, a)| format!("{n}={a}"))
            .collect();
        decayed.sort();
        let decayed = if half_life_ms > 0 {
            format!(" decayed[{}]", decayed.join(" "))
        } else {
            String::new()
        };
        println!(
            "{:<20} {:<20} {:<6} {:<7} {:<8} {}{decayed}",
            spec.name,
            parent,
            spec.weight,
            q.queued,
            q.admitted,
            cells.join(" ")
        );
    }
    if !capacity.is_empty() {
        let mut cells: Vec<String> = capacity.iter().map(|(n, a)| format!("{n}={a}")).collect();
        cells.sort();
        println!("cluster capacity: {}", cells.join(" "));
    }
    if half_life_ms > 0 {
        println!(
            "fair share over time: half-life {} s (the order measures usage + decayed)",
            half_life_ms as f64 / 1_000.0
        );
    }
}

/// `held/usable/total` devices (usable: healthy, in a pool still offered), `-` when the
/// node has none.
fn device_summary(n: &gangway_proto::v1::NodeInfo) -> String {
    if n.devices.is_empty() {
        return "-".to_string();
    }
    let healthy = (n.devices.iter())
        .filter(|d| !d.unhealthy && !d.withdrawn)
        .count();
    let held = n.devices.iter().filter(|d| !d.held_by.is_empty()).count();
    format!("{held}/{healthy}/{}", n.devices.len())
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
        std::process::exit(e.exit_code());
    }
}
