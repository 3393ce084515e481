//! `ferry trace <pod> <ip:port>` in the lab: opens one connection from the pod and prints every
//! hop it took (source node proxy, waypoint, east-west gateway, destination node proxy), each
//! hop's record joined by the trace id the source started. A refused connection shows the hop
//! that refused it and why.
//!
//! `ferry trace --id CONN_ID` follows a connection already made instead: the record with that
//! id (the access-log line's `conn.id`) at any component of the lab, or of the admin endpoints
//! given by `--admin`, then every hop with its trace id, in the same order.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value;

use crate::Output;
use crate::observe::{field, gather, gather_from, phases, text};

/// How long the hops' records may take to appear after the connection ended.
const RECORDS_BOUND: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
pub(crate) struct TraceArgs {
    /// The pod the connection starts from.
    #[arg(required_unless_present = "id")]
    pod: Option<String>,
    /// Where it goes: `IP:port`.
    #[arg(required_unless_present = "id")]
    to: Option<std::net::SocketAddr>,
    /// Open no connection: trace the one whose record has this id (the access-log line's
    /// `conn.id`, `ferry observe` prints it first).
    #[arg(long, value_name = "CONN_ID", conflicts_with_all = ["pod", "to"])]
    id: Option<String>,
    /// With --id: look at the admin endpoint at this address (`host:port` of a node proxy,
    /// waypoint or gateway; repeat for several) instead of the lab's components.
    #[arg(long, value_name = "ADDR", requires = "id", conflicts_with_all = ["pod", "to"])]
    admin: Vec<String>,
    #[arg(long, default_value = ferry_lab::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    output: Output,
}

pub(crate) fn run(args: &TraceArgs) -> ExitCode {
    match run_inner(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("ferry trace: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where a hop stands on the path: the source first, the destination last.
pub(crate) fn order(r: &Value) -> u8 {
    match field(r, "direction") {
        "outbound" => 0,
        "waypoint" => 1,
        "gateway" => 2,
        _ => 3,
    }
}

/// Traces a new connection or the one with `--id`; `Ok(false)` if it was refused or failed.
fn run_inner(args: &TraceArgs) -> anyhow::Result<bool> {
    match (&args.id, &args.pod, args.to) {
        (Some(id), _, _) => by_id(args, id),
        (None, Some(pod), Some(to)) => open(args, pod, to),
        _ => anyhow::bail!("give a pod and IP:port, or --id CONN_ID"),
    }
}

/// The hops of the connection whose record has `id`; `Ok(false)` if a hop refused it or it
/// failed at one.
fn by_id(args: &TraceArgs, id: &str) -> anyhow::Result<bool> {
    let lab = args.admin.is_empty().then_some(args.state_dir.as_path());
    let records = gather_from(lab, &args.admin)?;
    let found = records
        .iter()
        .find(|r| field(r, "id") == id)
        .cloned()
        .with_context(|| {
            format!("no record with id {id} at any component (each keeps only its last ones)")
        })?;
    let trace = field(&found, "trace_id").to_string();
    let mut hops = if trace.is_empty() {
        vec![found.clone()]
    } else {
        records
            .into_iter()
            .filter(|r| field(r, "trace_id") == trace)
            .collect()
    };
    hops.sort_by_key(order);
    let through = !hops
        .iter()
        .any(|h| field(h, "verdict") == "denied" || !field(h, "error").is_empty());
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"id": id, "trace_id": trace, "went_through": through, "hops": hops})
        ),
        Output::Text => {
            println!(
                "connection  {id} at {} ({}): {}",
                field(&found, "component"),
                field(&found, "direction"),
                if through {
                    "went through"
                } else {
                    "refused or failed"
                }
            );
            print_hops(&trace, &hops);
        }
    }
    Ok(through)
}

/// Opens a connection from `pod` to `to` and prints its hops; `Ok(false)` if it was refused
/// or failed.
fn open(args: &TraceArgs, pod: &str, to: std::net::SocketAddr) -> anyhow::Result<bool> {
    let ns = ferry_lab::pod_netns(&args.state_dir, pod)?;
    let start = now_ms();
    let sent = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args([
            "lab",
            "connect",
            &to.to_string(),
            "--data",
            "trace\n",
            "--local",
        ])
        .output()
        .context("opening the connection")?;
    let answer = String::from_utf8_lossy(&sent.stdout).trim().to_string();
    let connected = sent.status.success();
    let stderr = String::from_utf8_lossy(&sent.stderr);
    // The source's record: the outbound one from exactly the connection's address; if it was
    // reset before its address could be read (refused at once), the newest from the pod since.
    let local = stderr
        .lines()
        .find_map(|l| l.strip_prefix("local "))
        .map(str::to_string);
    let to_text = to.to_string();
    let ours = |r: &Value| {
        field(r, "direction") == "outbound"
            && match &local {
                Some(addr) => field(r, "src_addr") == addr,
                None => {
                    field(r, "src_workload") == pod
                        && field(r, "dst_addr") == to_text
                        && r["at_ms"].as_u64().unwrap_or(0) >= start
                }
            }
    };
    let deadline = Instant::now() + RECORDS_BOUND;
    let source = loop {
        if let Some(r) = gather(&args.state_dir)?.into_iter().rev().find(|r| ours(r)) {
            break r;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no record of the connection from {pod} at its node proxy ({})",
            stderr.trim()
        );
        std::thread::yield_now();
    };
    let trace = field(&source, "trace_id").to_string();
    // Every hop with the same trace id; the destination's record ends the path (a refusal at
    // an earlier hop has none: then whatever hops recorded it by the deadline).
    let mut hops = vec![source];
    if !trace.is_empty() {
        loop {
            hops = gather(&args.state_dir)?
                .into_iter()
                .filter(|r| field(r, "trace_id") == trace)
                .collect();
            let ended = hops.iter().any(|r| field(r, "direction") == "inbound")
                || hops.iter().any(|r| field(r, "verdict") == "denied");
            if ended || Instant::now() >= deadline {
                break;
            }
            std::thread::yield_now();
        }
    }
    hops.sort_by_key(order);
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"trace_id": trace, "connected": connected, "answer": answer, "hops": hops})
        ),
        Output::Text => {
            println!(
                "connection  {pod} -> {to}: {}",
                if connected {
                    "connected"
                } else {
                    "refused or failed"
                }
            );
            print_hops(&trace, &hops);
            if connected {
                println!("answer      {answer}");
            }
        }
    }
    Ok(connected)
}

/// The trace id and each hop, in path order, with its error if it has one.
fn print_hops(trace: &str, hops: &[Value]) {
    println!(
        "trace id    {}",
        if trace.is_empty() {
            "(none: refused at the source)"
        } else {
            trace
        }
    );
    for (i, h) in hops.iter().enumerate() {
        println!("{:>3}  {}", i + 1, text(h));
        if !field(h, "route").is_empty() {
            println!("     route: {}", field(h, "route"));
        }
        if let Some(p) = phases(h) {
            println!("     phases: {p}");
        }
        if !field(h, "error").is_empty() {
            println!("     error: {}", field(h, "error"));
        }
    }
}
