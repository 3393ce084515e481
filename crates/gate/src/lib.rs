//! Instruction-count gates: a benchmark program runs itself under `valgrind --tool=callgrind`,
//! counts the instructions of each figure's function (inclusive: everything it calls), divides
//! by the units of work done inside it, and compares each figure with a committed baseline. A
//! figure more than its margin over the baseline fails the gate; one that far under it is
//! reported, so the baseline can be lowered.
//!
//! Instruction counts are the same on a busy machine as on an idle one, which is why CI can
//! gate on them where it cannot on time. Used by `ferry-core`'s decision-cost gate and
//! `ferry-hbone`'s data-path gate (their `benches/instructions.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child that valgrind runs.
pub const CHILD_ENV: &str = "FERRY_INSTRUCTIONS_CHILD";

/// Set to write the figures measured as the new baseline.
pub const UPDATE_ENV: &str = "FERRY_INSTRUCTIONS_UPDATE";

/// Whether this process is the child valgrind runs.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// One figure: its name, the function whose inclusive instructions are counted, and the units
/// of work done inside it (decisions, MiB, streams).
#[derive(Clone, Copy, Debug)]
pub struct Figure {
    pub name: &'static str,
    pub function: &'static str,
    pub units: u64,
}

/// A gate: its figures, its baseline file and how far over it a figure may go.
#[derive(Debug)]
pub struct Gate<'a> {
    /// What the figures are, printed above them.
    pub title: String,
    pub figures: &'a [Figure],
    pub baseline: PathBuf,
    /// How the baseline is made, written at its top.
    pub how: &'a str,
    pub margin_percent: u64,
}

impl Gate<'_> {
    /// Runs the gate ([`Gate::run`]) as a program's `main` does: failure when a figure went
    /// over its margin or the count could not be made (said on stderr).
    pub fn exit_code(&self) -> std::process::ExitCode {
        match self.run() {
            Ok(true) => std::process::ExitCode::SUCCESS,
            Ok(false) => std::process::ExitCode::FAILURE,
            Err(e) => {
                eprintln!("instructions: {e}");
                std::process::ExitCode::FAILURE
            }
        }
    }

    /// Counts every figure in one run of this program under callgrind, prints each against the
    /// baseline, and writes the baseline instead when [`UPDATE_ENV`] is set. `Ok(false)` when a
    /// figure went over its margin.
    pub fn run(&self) -> Result<bool, String> {
        let baseline = read_baseline(&self.baseline)?;
        let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
        let dir = std::env::temp_dir().join(format!("ferry-instructions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let counted = self.count(&exe, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        let counted = counted?;

        let margin = self.margin_percent;
        println!("{} (callgrind; margin {margin}%):", self.title);
        let mut pass = true;
        for (figure, n) in &counted {
            let Some(&base) = baseline.get(figure) else {
                // A renamed or new figure would otherwise go ungated.
                println!("  {figure:<16} {n:>10}  FAIL: no baseline ({UPDATE_ENV}=1 writes one)");
                pass = false;
                continue;
            };
            let change = (*n as f64 / base as f64 - 1.0) * 100.0;
            let verdict = match judge(*n, base, margin) {
                Verdict::Over { limit } => {
                    pass = false;
                    format!("FAIL: over the limit {limit}")
                }
                Verdict::WellUnder => format!("well under: lower the baseline ({UPDATE_ENV}=1)"),
                Verdict::Ok => "ok".to_string(),
            };
            println!("  {figure:<16} {n:>10}  baseline {base:>10}  {change:+6.1}%  {verdict}");
        }
        if std::env::var_os(UPDATE_ENV).is_some() {
            write_baseline(&self.baseline, self.how, &counted)?;
            println!("baseline written to {}", self.baseline.display());
            return Ok(true);
        }
        Ok(pass)
    }

    /// Instructions per unit of every figure: one run under callgrind, collecting only inside
    /// the figures' functions, and each function's inclusive count read back with
    /// `callgrind_annotate` (valgrind's own tool).
    fn count(&self, exe: &Path, dir: &Path) -> Result<BTreeMap<String, u64>, String> {
        let out = dir.join("callgrind.out");
        let mut valgrind = Command::new("valgrind");
        valgrind
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()));
        for f in self.figures {
            valgrind.arg(format!("--toggle-collect={}", f.function));
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
        self.figures
            .iter()
            .map(|f| {
                let total = inclusive(&text, f.function).ok_or_else(|| {
                    format!(
                        "figure {}: nothing was counted in {} (was it inlined or renamed?)",
                        f.name, f.function
                    )
                })?;
                Ok((f.name.to_string(), total / f.units.max(1)))
            })
            .collect()
    }
}

/// A figure against its baseline.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Ok,
    /// More than the margin over the baseline: the gate fails.
    Over {
        limit: u64,
    },
    /// More than the margin under it: the baseline could be lowered.
    WellUnder,
}

fn judge(n: u64, base: u64, margin_percent: u64) -> Verdict {
    let slack = base * margin_percent / 100;
    if n > base + slack {
        Verdict::Over {
            limit: base + slack,
        }
    } else if n < base.saturating_sub(slack) {
        Verdict::WellUnder
    } else {
        Verdict::Ok
    }
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

/// `figure count` lines; `#` starts a comment. A missing file is an empty baseline.
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

fn write_baseline(path: &Path, how: &str, figures: &BTreeMap<String, u64>) -> Result<(), String> {
    let mut text: String = how.lines().map(|l| format!("# {l}\n")).collect();
    for (figure, n) in figures {
        text.push_str(&format!("{figure} {n}\n"));
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_over_its_margin_fails_and_one_far_under_says_so() {
        assert_eq!(judge(1_250, 1_000, 25), Verdict::Ok);
        assert_eq!(judge(1_251, 1_000, 25), Verdict::Over { limit: 1_250 });
        assert_eq!(judge(750, 1_000, 25), Verdict::Ok);
        assert_eq!(judge(749, 1_000, 25), Verdict::WellUnder);
        assert_eq!(judge(1_000, 1_000, 0), Verdict::Ok);
        assert_eq!(judge(1, 1_000, 150), Verdict::Ok, "a margin over 100%");
    }

    #[test]
    fn an_inclusive_count_is_read_from_its_own_line_only() {
        let annotated = "\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
 9,999,999 (100.0%)  PROGRAM TOTALS
 1,234,567 (12.34%)  /src/benches/instructions.rs:instructions::count_plan [/target/instructions-1]
   555,555 ( 5.55%)  /src/core/route.rs:instructions::count_plan
    42,000 ( 0.42%)  /src/benches/instructions.rs:instructions::count_plan_compact [/target/instructions-1]
";
        assert_eq!(
            inclusive(annotated, "instructions::count_plan"),
            Some(1_234_567)
        );
        assert_eq!(
            inclusive(annotated, "instructions::count_plan_compact"),
            Some(42_000)
        );
        assert_eq!(inclusive(annotated, "instructions::count"), None);
    }

    #[test]
    fn a_baseline_reads_back_what_was_written_and_names_a_bad_line() {
        let dir = std::env::temp_dir().join(format!("ferry-gate-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("baseline");
        let figures: BTreeMap<String, u64> = [("a".to_string(), 12), ("b".to_string(), 7)].into();
        write_baseline(&path, "made by a test\nsecond line", &figures).expect("written");
        assert_eq!(read_baseline(&path).expect("read"), figures);
        std::fs::write(&path, "a 12\nb seven\n").expect("written");
        let err = read_baseline(&path).expect_err("a bad count");
        assert!(err.ends_with("line 2: expected `figure count`"), "{err}");
        assert!(read_baseline(&dir.join("none")).expect("none").is_empty());
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
