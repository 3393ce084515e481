//! The decision-cost gate: instructions per decision, counted by callgrind (exact, and the same
//! on a busy machine as on an idle one), against the committed baseline
//! `benches/instructions.baseline`. A figure more than [`MARGIN_PERCENT`] over its baseline
//! fails; one more than that under it is reported, so the baseline can be lowered.
//!
//! Run: `cargo bench -p ferry-core --bench instructions` (needs `valgrind`, the Debian package).
//! `FERRY_INSTRUCTIONS_UPDATE=1` writes the figures measured as the new baseline.
//!
//! The figures, each over [`DECISIONS`] decisions on the `decisions` benchmark's mesh (10,000
//! workloads), from the same sources to the same destinations in every run:
//! - `plan`: a connection to a service VIP, decided as the node proxy does with records off
//!   (`route::plan`, no trace);
//! - `plan_compact`: the same with a connection record's bounded trace and its summary line
//!   (`route::plan_compact`);
//! - `authorize`: an L4 authorization check at the destination (1,000 policies).
//!
//! The counts depend on the compiler and the C library's allocator (the benchmark uses the
//! system's); a toolchain change may move them, and the baseline is rewritten then. The
//! snapshot's maps hash with random keys, so two runs differ by a few instructions.
//!
//! How it works: this program runs itself under `valgrind --tool=callgrind`, once per figure,
//! with collection on only inside that figure's loop (`--toggle-collect`), and divides the
//! instructions collected by the decisions made.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use ferry_core::authz::{ConnInfo, authorize};
use ferry_core::identity::Identity;
use ferry_core::model::Workload;
use ferry_core::random::{Random, SplitMix64};
use ferry_core::route::{Compact, Destination, Source, Within, plan, plan_compact};
use ferry_core::snapshot::Snapshot;

mod common;
use common::{POLICIES, SERVICES, SOURCES, WORKLOADS, mesh};

/// Decisions per figure.
const DECISIONS: u64 = 10_000;

/// How far over its baseline a figure may go before the gate fails.
const MARGIN_PERCENT: u64 = 10;

/// The figures, each with the function whose instructions are counted.
const FIGURES: [(&str, &str); 3] = [
    ("plan", "instructions::count_plan"),
    ("plan_compact", "instructions::count_plan_compact"),
    ("authorize", "instructions::count_authorize"),
];

/// Set in the child that valgrind runs.
const CHILD_ENV: &str = "FERRY_INSTRUCTIONS_CHILD";

fn main() -> ExitCode {
    if std::env::var_os(CHILD_ENV).is_some() {
        decide();
        return ExitCode::SUCCESS;
    }
    match gate() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("instructions: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The connections of every figure: sources and destinations in uid and key order, drawn with
/// a fixed seed.
struct Work<'a> {
    sources: Vec<&'a Workload>,
    ids: Vec<Identity>,
    vips: Vec<Destination>,
    dsts: Vec<&'a Workload>,
}

/// A figure's loop: makes [`DECISIONS`] decisions, returns how many succeeded.
type Count = fn(&Snapshot, &Work<'_>, &mut SplitMix64) -> u64;

/// The child: builds the mesh once, then makes each figure's decisions inside its counted
/// function.
fn decide() {
    let snap = mesh().build();
    let sources = common::workloads(&snap, 0, SOURCES);
    let work = Work {
        ids: sources
            .iter()
            .map(|w| w.identity().expect("generated identities are valid"))
            .collect(),
        sources,
        vips: common::vips(&snap),
        dsts: common::workloads(&snap, 1, SOURCES),
    };
    let counted: [(&str, Count); 3] = [
        ("plan", count_plan),
        ("plan_compact", count_plan_compact),
        ("authorize", count_authorize),
    ];
    for (figure, count) in counted {
        let ok = count(&snap, &work, &mut SplitMix64::new(7));
        // A routing decision that fails would be counted as a cheap one: most must succeed.
        // (Most authorizations are denials: the checks are as thorough either way.)
        assert!(
            figure == "authorize" || ok > DECISIONS * 9 / 10,
            "{figure}: only {ok} of {DECISIONS} succeeded"
        );
    }
}

#[inline(never)]
fn count_plan(snap: &Snapshot, w: &Work<'_>, rng: &mut SplitMix64) -> u64 {
    let mut ok = 0;
    for _ in 0..DECISIONS {
        let src = w.sources[rng.below(w.sources.len() as u64) as usize];
        let dst = &w.vips[rng.below(w.vips.len() as u64) as usize];
        ok += u64::from(black_box(plan(snap, Source::new(src), dst, rng).is_ok()));
    }
    ok
}

#[inline(never)]
fn count_plan_compact(snap: &Snapshot, w: &Work<'_>, rng: &mut SplitMix64) -> u64 {
    let mut ok = 0;
    for _ in 0..DECISIONS {
        let src = w.sources[rng.below(w.sources.len() as u64) as usize];
        let dst = &w.vips[rng.below(w.vips.len() as u64) as usize];
        let mut trace = Compact::new();
        let planned = plan_compact(
            snap,
            Source::new(src),
            dst,
            &Within::default(),
            rng,
            &mut trace,
        );
        black_box(trace.summary());
        ok += u64::from(black_box(planned.is_ok()));
    }
    ok
}

#[inline(never)]
fn count_authorize(snap: &Snapshot, w: &Work<'_>, rng: &mut SplitMix64) -> u64 {
    let mut ok = 0;
    for _ in 0..DECISIONS {
        let i = rng.below(w.sources.len() as u64) as usize;
        let dst = w.dsts[rng.below(w.dsts.len() as u64) as usize];
        let conn = ConnInfo {
            source_identity: Some(&w.ids[i]),
            source_ip: w.sources[i].addresses[0],
            destination_ip: dst.addresses[0],
            destination_port: 8080,
            via_waypoint: false,
        };
        ok += u64::from(black_box(authorize(snap, dst, &conn).is_allowed()));
    }
    ok
}

/// The parent: counts every figure under callgrind and compares it with the baseline.
/// `Ok(false)` when a figure went over its margin.
fn gate() -> Result<bool, String> {
    let baseline_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/instructions.baseline");
    let baseline = read_baseline(&baseline_path)?;
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let dir = std::env::temp_dir().join(format!("ferry-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let counted = count(&exe, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let counted = counted?;

    let mut pass = true;
    println!(
        "instructions per decision ({DECISIONS} decisions each on {WORKLOADS} workloads, {SERVICES} services, {POLICIES} policies; callgrind; margin {MARGIN_PERCENT}%):"
    );
    for (figure, n) in &counted {
        let Some(&base) = baseline.get(figure) else {
            println!("  {figure:<14} {n:>7}  (no baseline)");
            continue;
        };
        let limit = base + base * MARGIN_PERCENT / 100;
        let change = (*n as f64 / base as f64 - 1.0) * 100.0;
        let verdict = if *n > limit {
            pass = false;
            format!("FAIL: over the limit {limit}")
        } else if *n < base - base * MARGIN_PERCENT / 100 {
            "well under: lower the baseline (FERRY_INSTRUCTIONS_UPDATE=1)".to_string()
        } else {
            "ok".to_string()
        };
        println!("  {figure:<14} {n:>7}  baseline {base:>7}  {change:+6.1}%  {verdict}");
    }
    if std::env::var_os("FERRY_INSTRUCTIONS_UPDATE").is_some() {
        write_baseline(&baseline_path, &counted)?;
        println!("baseline written to {}", baseline_path.display());
        return Ok(true);
    }
    Ok(pass)
}

/// Instructions per decision of every figure: one run under callgrind, collecting only inside
/// the figures' functions, and each function's inclusive count read back with
/// `callgrind_annotate` (valgrind's own tool).
fn count(exe: &Path, dir: &Path) -> Result<BTreeMap<String, u64>, String> {
    let out: PathBuf = dir.join("callgrind.out");
    let mut valgrind = Command::new("valgrind");
    valgrind
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()));
    for (_, function) in FIGURES {
        valgrind.arg(format!("--toggle-collect={function}"));
    }
    let run = valgrind
        .arg(exe)
        .env(CHILD_ENV, "1")
        .output()
        .map_err(|e| format!("running valgrind: {e} (install it: apt-get install valgrind)"))?;
    if !run.status.success() {
        return Err(format!(
            "valgrind exited with {}: {}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let annotated = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(&out)
        .output()
        .map_err(|e| format!("running callgrind_annotate: {e}"))?;
    if !annotated.status.success() {
        return Err(format!(
            "callgrind_annotate exited with {}: {}",
            annotated.status,
            String::from_utf8_lossy(&annotated.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&annotated.stdout);
    FIGURES
        .iter()
        .map(|(figure, function)| {
            let total = inclusive(&text, function).ok_or_else(|| {
                format!("figure {figure}: nothing was counted in {function} (was it inlined or renamed?)")
            })?;
            Ok((figure.to_string(), total / DECISIONS))
        })
        .collect()
}

/// The inclusive count of `function` in `callgrind_annotate --inclusive=yes` output: its line
/// `  1,234,567 (12.34%)  /path/file.rs:function [/path/binary]` (lines without the binary are
/// parts of it inlined from other files).
fn inclusive(annotated: &str, function: &str) -> Option<u64> {
    annotated.lines().find_map(|line| {
        let (count, rest) = line.trim_start().split_once(' ')?;
        let (_, name) = rest.split_once(':')?;
        let name = name.strip_suffix(']')?.rsplit_once(" [")?.0;
        (name == function)
            .then(|| count.replace(',', "").parse().ok())
            .flatten()
    })
}

/// `figure count` lines; `#` starts a comment.
fn read_baseline(path: &Path) -> Result<BTreeMap<String, u64>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut figures = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = || format!("{} line {}: expected `figure count`", path.display(), i + 1);
        let (figure, n) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
        let n = n.trim().parse().map_err(|_| bad())?;
        figures.insert(figure.to_string(), n);
    }
    Ok(figures)
}

fn write_baseline(path: &Path, figures: &BTreeMap<String, u64>) -> Result<(), String> {
    let mut text = String::from(
        "# Instructions per decision: `cargo bench -p ferry-core --bench instructions`.\n\
         # Written with FERRY_INSTRUCTIONS_UPDATE=1; see benches/instructions.rs.\n",
    );
    for (figure, n) in figures {
        text.push_str(&format!("{figure} {n}\n"));
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
