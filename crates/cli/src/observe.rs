//! `ferry observe`: the connection records of every node proxy and waypoint of a running lab,
//! merged in time order and filtered (`--verdict`, `--from`, `--to`, `--service`), as text or
//! JSON lines. Each component keeps its own bounded ring (`ferry_runtime::records`) and serves
//! it at `/records`; this reads them all once.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;

use crate::Output;

/// What `ferry observe` is asked.
#[derive(Debug, clap::Args)]
pub(crate) struct ObserveArgs {
    /// Read the lab that is up in --state-dir (the only source today).
    #[arg(long)]
    lab: bool,
    #[arg(long, default_value = ferry_lab::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
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
        args.lab,
        "give --lab: the lab is the only source of records today"
    );
    let mut records = gather(&args.state_dir)?;
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
pub(crate) fn gather(state_dir: &std::path::Path) -> anyhow::Result<Vec<Value>> {
    let mut records = Vec::new();
    for c in ferry_lab::components(state_dir)? {
        let body = match ferry_lab::admin_get(&c, "/records") {
            Ok(b) => b,
            Err(e) => {
                eprintln!("ferry observe: {e:#}");
                continue;
            }
        };
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Value>(line) {
                Ok(mut v) => {
                    v["component"] = Value::String(c.name.clone());
                    records.push(v);
                }
                Err(e) => eprintln!("ferry observe: {}: a record that is not JSON: {e}", c.name),
            }
        }
    }
    records.sort_by_key(|r| r["at_ms"].as_u64().unwrap_or(0));
    Ok(records)
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
            .trace
            .as_deref()
            .is_none_or(|t| field(r, "trace_id") == t)
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
