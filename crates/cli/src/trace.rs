//! `ferry trace <pod> <ip:port>` in the lab: opens one connection from the pod and prints every
//! hop it took (source node proxy, waypoint, east-west gateway, destination node proxy), each
//! hop's record joined by the trace id the source started. A refused connection shows the hop
//! that refused it and why.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value;

use crate::Output;
use crate::observe::{field, gather, text};

/// How long the hops' records may take to appear after the connection ended.
const RECORDS_BOUND: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
pub(crate) struct TraceArgs {
    /// The pod the connection starts from.
    pod: String,
    /// Where it goes: `IP:port`.
    to: std::net::SocketAddr,
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

/// Runs the connection; `Ok(false)` if it was refused or failed.
fn run_inner(args: &TraceArgs) -> anyhow::Result<bool> {
    let ns = ferry_lab::pod_netns(&args.state_dir, &args.pod)?;
    let start = now_ms();
    let sent = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args([
            "lab",
            "connect",
            &args.to.to_string(),
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
    let to = args.to.to_string();
    let ours = |r: &Value| {
        field(r, "direction") == "outbound"
            && match &local {
                Some(addr) => field(r, "src_addr") == addr,
                None => {
                    field(r, "src_workload") == args.pod
                        && field(r, "dst_addr") == to
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
            "no record of the connection from {} at its node proxy ({})",
            args.pod,
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
                "connection  {} -> {}: {}",
                args.pod,
                args.to,
                if connected {
                    "connected"
                } else {
                    "refused or failed"
                }
            );
            println!(
                "trace id    {}",
                if trace.is_empty() {
                    "(none: refused at the source)"
                } else {
                    &trace
                }
            );
            for (i, h) in hops.iter().enumerate() {
                println!("{:>3}  {}", i + 1, text(h));
                if !field(h, "error").is_empty() {
                    println!("     error: {}", field(h, "error"));
                }
            }
            if connected {
                println!("answer      {answer}");
            }
        }
    }
    Ok(connected)
}
