//! `ferry observe`: the connection records of node proxies, waypoints and east-west gateways,
//! filtered (`--verdict`, `--from`, `--to`, `--service`, `--cluster`, `--trace`), as text or
//! JSON lines. Each component keeps its own bounded ring (`ferry_runtime::records`) and serves
//! it at `/records`. The sources: every component of a running lab (`--lab`, found by itself)
//! and any admin endpoint by address (`--admin host:port`, repeatable).
//!
//! Without `--follow`, the records each keeps, read once and merged in time order. With
//! `--follow`, a live stream (`/records?follow=1` on every source): each record printed as its
//! hop ends it, until interrupted, `--count` records or `--duration` seconds. A line on stderr
//! says when every source answered (`following N of M components`); a source that cannot be
//! followed, misses records or goes away is reported there too.

mod source;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use self::source::Event;
pub(crate) use self::source::Source;
use crate::Output;

/// What `ferry observe` is asked.
#[derive(Debug, clap::Args)]
pub(crate) struct ObserveArgs {
    /// Read every node proxy, waypoint and gateway of the lab that is up in --state-dir.
    #[arg(long)]
    lab: bool,
    #[arg(long, default_value = ferry_lab::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Read the admin endpoint at this address: `host:port` of a node proxy, waypoint or
    /// gateway (repeat for several; with or without --lab).
    #[arg(long, value_name = "ADDR")]
    admin: Vec<String>,
    /// A live stream: print each record as it is made, until interrupted.
    #[arg(long, short)]
    follow: bool,
    /// With --follow: stop after this many records (those that pass the filters).
    #[arg(long, requires = "follow", value_name = "N")]
    count: Option<u64>,
    /// With --follow: stop after this many seconds.
    #[arg(long, requires = "follow", value_name = "SECS")]
    duration: Option<u64>,
    /// Only records with this verdict.
    #[arg(long, value_enum)]
    verdict: Option<Verdict>,
    /// Only connections from a source whose workload, address or identity contains this.
    #[arg(long)]
    from: Option<String>,
    /// Only connections to a destination whose address, workload or service contains this.
    #[arg(long)]
    to: Option<String>,
    /// Only connections to a service whose name contains this.
    #[arg(long)]
    service: Option<String>,
    /// Only connections whose source or destination is in this cluster.
    #[arg(long)]
    cluster: Option<String>,
    /// Only the hops of one connection: its W3C trace id (`ferry trace` prints it).
    #[arg(long)]
    trace: Option<String>,
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Verdict {
    Allowed,
    Denied,
}

pub(crate) fn run(args: &ObserveArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry observe: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(args: &ObserveArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.lab || !args.admin.is_empty(),
        "give --lab, or --admin ADDR for each admin endpoint to read"
    );
    if args.follow {
        return follow(args);
    }
    let mut records = gather_from(args.lab.then_some(args.state_dir.as_path()), &args.admin)?;
    records.retain(|r| keep(args, r));
    for r in &records {
        match args.output {
            Output::Json => println!("{r}"),
            Output::Text => println!("{}", text(r)),
        }
    }
    Ok(())
}

/// Every record of every component of the lab in `state_dir`, each with its `component`,
/// oldest first. A component that does not answer is reported on stderr and skipped.
pub(crate) fn gather(state_dir: &Path) -> anyhow::Result<Vec<Value>> {
    let mut records = Vec::new();
    for c in ferry_lab::components(state_dir)? {
        match ferry_lab::admin_get(&c, "/records") {
            Ok(body) => records.extend(parse(&c.name, &body)),
            Err(e) => eprintln!("ferry observe: {e:#}"),
        }
    }
    records.sort_by_key(|r| r["at_ms"].as_u64().unwrap_or(0));
    Ok(records)
}

/// Every record of the lab in `lab` (if given) and of the admin endpoints at `admins`, each
/// with its `component`, oldest first. A source that does not answer is reported on stderr
/// and skipped.
pub(crate) fn gather_from(lab: Option<&Path>, admins: &[String]) -> anyhow::Result<Vec<Value>> {
    let mut records = match lab {
        Some(dir) => gather(dir)?,
        None => Vec::new(),
    };
    if !admins.is_empty() {
        let asked = runtime()?.block_on(async {
            let asks: Vec<_> = admins
                .iter()
                .map(|a| {
                    let s = Source::admin(a);
                    tokio::spawn(async move {
                        let body = s.get("/records").await;
                        (s.name, body)
                    })
                })
                .collect();
            let mut bodies = Vec::new();
            for ask in asks {
                bodies.push(ask.await);
            }
            bodies
        });
        for answer in asked {
            match answer {
                Ok((name, Ok(body))) => records.extend(parse(&name, &body)),
                Ok((_, Err(e))) => eprintln!("ferry observe: {e:#}"),
                Err(e) => eprintln!("ferry observe: {e}"),
            }
        }
        records.sort_by_key(|r| r["at_ms"].as_u64().unwrap_or(0));
    }
    Ok(records)
}

/// The records in `body` (JSON lines) from the component `name`, each with its `component`.
fn parse(name: &str, body: &str) -> Vec<Value> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|line| match serde_json::from_str::<Value>(line) {
            Ok(mut v) => {
                v["component"] = Value::String(name.to_string());
                Some(v)
            }
            Err(e) => {
                eprintln!("ferry observe: {name}: a record that is not JSON: {e}");
                None
            }
        })
        .collect()
}

/// A runtime for the asks of one command.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `--follow`: every source followed at once, each record printed as it comes.
fn follow(args: &ObserveArgs) -> anyhow::Result<()> {
    let mut sources = if args.lab {
        Source::lab(&args.state_dir)?
    } else {
        Vec::new()
    };
    sources.extend(args.admin.iter().map(|a| Source::admin(a)));
    anyhow::ensure!(!sources.is_empty(), "the lab has no component to follow");
    runtime()?.block_on(follow_all(args, sources))
}

async fn follow_all(args: &ObserveArgs, sources: Vec<Source>) -> anyhow::Result<()> {
    let total = sources.len();
    let (tx, mut events) = mpsc::channel(1024);
    for s in sources {
        tokio::spawn(s.follow(tx.clone()));
    }
    drop(tx);
    let stop = async {
        match args.duration {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let (mut answered, mut following, mut printed) = (0, 0, 0);
    let mut out = std::io::stdout().lock();
    loop {
        let event = tokio::select! {
            e = events.recv() => e,
            () = &mut stop => return Ok(()),
            _ = &mut interrupted => return Ok(()),
        };
        let Some(event) = event else {
            anyhow::bail!("every component followed went away");
        };
        match event {
            Event::Following => {
                answered += 1;
                following += 1;
            }
            Event::Failed(name, e) => {
                answered += 1;
                eprintln!("ferry observe: {name} cannot be followed: {e:#}");
            }
            Event::Record(r) => {
                if !keep(args, &r) {
                    continue;
                }
                let line = match args.output {
                    Output::Json => r.to_string(),
                    Output::Text => text(&r),
                };
                if writeln!(out, "{line}").is_err() {
                    // Whoever read the output is gone.
                    return Ok(());
                }
                printed += 1;
                if args.count.is_some_and(|n| printed >= n) {
                    return Ok(());
                }
                continue;
            }
            Event::Lagged(name, n) => {
                eprintln!("ferry observe: {name}: {n} records missed (this follower fell behind)");
                continue;
            }
            Event::Garbled(name, e) => {
                eprintln!("ferry observe: {name}: {e:#}");
                continue;
            }
            Event::Ended(name, e) => {
                following -= 1;
                eprintln!("ferry observe: {name} went away: {e:#}");
                continue;
            }
        }
        if answered == total {
            anyhow::ensure!(following > 0, "no component could be followed");
            eprintln!("ferry observe: following {following} of {total} components");
        }
    }
}

pub(crate) fn field<'v>(r: &'v Value, k: &str) -> &'v str {
    r[k].as_str().unwrap_or("")
}

/// Whether record `r` passes every filter of `args`.
fn keep(args: &ObserveArgs, r: &Value) -> bool {
    let any = |keys: &[&str], needle: &str| keys.iter().any(|k| field(r, k).contains(needle));
    args.verdict.is_none_or(|v| {
        field(r, "verdict")
            == match v {
                Verdict::Allowed => "allowed",
                Verdict::Denied => "denied",
            }
    }) && args
        .from
        .as_deref()
        .is_none_or(|f| any(&["src_workload", "src_addr", "src_identity"], f))
        && args.to.as_deref().is_none_or(|t| {
            any(
                &["dst_addr", "dst_hbone_addr", "dst_workload", "dst_service"],
                t,
            )
        })
        && args
            .service
            .as_deref()
            .is_none_or(|s| field(r, "dst_service").contains(s))
        && args
            .cluster
            .as_deref()
            .is_none_or(|c| field(r, "src_cluster") == c || field(r, "dst_cluster") == c)
        && args
            .trace
            .as_deref()
            .is_none_or(|t| field(r, "trace_id") == t)
}

/// A record's phases, each from the connection's start at that hop (`decision 41µs, connect
/// 1.27ms (handshake 1.10ms), first byte 1.98ms`); `None` when it recorded none.
pub(crate) fn phases(r: &Value) -> Option<String> {
    let us = |k: &str| r[k].as_u64().unwrap_or(0);
    let show = |v: u64| {
        if v >= 1000 {
            format!("{:.2}ms", v as f64 / 1000.0)
        } else {
            format!("{v}µs")
        }
    };
    let mut parts = Vec::new();
    if us("decision_us") > 0 {
        parts.push(format!("decision {}", show(us("decision_us"))));
    }
    if us("connect_us") > 0 {
        let handshake = match us("tls_us") {
            0 => String::new(),
            t => format!(" (new connection's handshake {})", show(t)),
        };
        parts.push(format!("connect {}{handshake}", show(us("connect_us"))));
    }
    if us("first_byte_us") > 0 {
        parts.push(format!("first byte {}", show(us("first_byte_us"))));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// One record as a line of text.
pub(crate) fn text(r: &Value) -> String {
    let src = match field(r, "src_workload") {
        "" => field(r, "src_addr").to_string(),
        w => format!("{w} ({})", field(r, "src_addr")),
    };
    let dst = match field(r, "dst_hbone_addr") {
        "" => field(r, "dst_addr"),
        a => a,
    };
    let service = match field(r, "dst_service") {
        "" => String::new(),
        s => format!(" [{s}]"),
    };
    let verdict = match field(r, "verdict") {
        "denied" => format!(
            "DENIED by policy {} rule {}",
            field(r, "policy"),
            field(r, "rule")
        ),
        v => v.to_string(),
    };
    format!(
        "{} {} {} {src} -> {dst}{service} {verdict} flags={} path=\"{}\" sent={} recv={} {}ms",
        field(r, "id"),
        field(r, "component"),
        field(r, "direction"),
        field(r, "response_flags"),
        field(r, "path"),
        r["bytes_sent"],
        r["bytes_recv"],
        r["duration_ms"],
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::phases;

    #[test]
    fn phases_read_in_order_and_only_those_recorded() {
        let r =
            json!({"decision_us": 41, "connect_us": 1270, "tls_us": 1102, "first_byte_us": 1980});
        assert_eq!(
            phases(&r).as_deref(),
            Some(
                "decision 41µs, connect 1.27ms (new connection's handshake 1.10ms), first byte 1.98ms"
            )
        );
        let pooled = json!({"decision_us": 12, "connect_us": 90});
        assert_eq!(
            phases(&pooled).as_deref(),
            Some("decision 12µs, connect 90µs")
        );
        assert_eq!(phases(&json!({"decision_us": 0})), None);
    }
}
