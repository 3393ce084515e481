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
//! How it works ([`ferry_gate`]): this program runs itself once under `valgrind
//! --tool=callgrind`, with collection on only inside the figures' loops (`--toggle-collect`),
//! and divides each loop's instructions by the decisions it made.

use std::hint::black_box;
use std::path::Path;
use std::process::ExitCode;

use ferry_core::authz::{ConnInfo, authorize};
use ferry_core::identity::Identity;
use ferry_core::model::Workload;
use ferry_core::random::{Random, SplitMix64};
use ferry_core::route::{Compact, Destination, Source, Within, plan, plan_compact};
use ferry_core::snapshot::Snapshot;
use ferry_gate::{Figure, Gate};

mod common;
use common::{POLICIES, SERVICES, SOURCES, WORKLOADS, mesh};

/// Decisions per figure.
const DECISIONS: u64 = 10_000;

/// How far over its baseline a figure may go before the gate fails.
const MARGIN_PERCENT: u64 = 10;

/// The figures, each with the function whose instructions are counted.
const FIGURES: [Figure; 3] = [
    Figure {
        name: "plan",
        function: "instructions::count_plan",
        units: DECISIONS,
    },
    Figure {
        name: "plan_compact",
        function: "instructions::count_plan_compact",
        units: DECISIONS,
    },
    Figure {
        name: "authorize",
        function: "instructions::count_authorize",
        units: DECISIONS,
    },
];

fn main() -> ExitCode {
    if ferry_gate::is_child() {
        decide();
        return ExitCode::SUCCESS;
    }
    let gate = Gate {
        title: format!(
            "instructions per decision ({DECISIONS} decisions each on {WORKLOADS} workloads, {SERVICES} services, {POLICIES} policies)"
        ),
        figures: &FIGURES,
        baseline: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/instructions.baseline"),
        how: "Instructions per decision: `cargo bench -p ferry-core --bench instructions`.\nWritten with FERRY_INSTRUCTIONS_UPDATE=1; see benches/instructions.rs.",
        margin_percent: MARGIN_PERCENT,
    };
    gate.exit_code()
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
