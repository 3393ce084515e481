//! `ferry lab bench-gate`: the proxies' CPU per unit of work in `ferry lab bench --json`
//! reports, against a committed baseline, with a generous margin: a figure more than the
//! margin above its baseline fails the gate. With several reports, each figure is their median
//! (one noisy run does not decide). Reports of another build profile than the baseline's are
//! refused: a debug build against a release baseline says nothing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::Value;

/// The figures gated: lower is better, each the CPU of both node proxies per unit of work.
pub(crate) const FIGURES: [&str; 4] = [
    "/arms/ferry/bulk/proxy_cpu_s_per_gb",
    "/arms/ferry/rr_64b/proxy_cpu_us_per_round_trip",
    "/arms/ferry/rr_1kib/proxy_cpu_us_per_round_trip",
    "/arms/ferry/conns/proxy_cpu_us_per_conn",
];

/// One figure's verdict.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    pub(crate) figure: &'static str,
    pub(crate) baseline: f64,
    /// The median of the reports' values.
    pub(crate) current: f64,
    pub(crate) passed: bool,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Judges `reports` against `baseline`: every gated figure the baseline has must be in every
/// report, and its median at most `margin` (0.25: 25%) above the baseline's.
pub(crate) fn judge(
    baseline: &Value,
    reports: &[Value],
    margin: f64,
) -> anyhow::Result<Vec<Verdict>> {
    if reports.is_empty() {
        bail!("no report to judge");
    }
    let profile = |v: &Value| v.pointer("/build_profile").cloned().unwrap_or(Value::Null);
    for r in reports {
        if profile(r) != profile(baseline) {
            bail!(
                "a report of build profile {} against a baseline of {}: measure the same build",
                profile(r),
                profile(baseline)
            );
        }
    }
    let mut out = Vec::new();
    for figure in FIGURES {
        let Some(base) = baseline.pointer(figure).and_then(Value::as_f64) else {
            continue;
        };
        let values = reports
            .iter()
            .map(|r| r.pointer(figure).and_then(Value::as_f64))
            .collect::<Option<Vec<f64>>>()
            .with_context(|| format!("{figure} is missing from a report"))?;
        let current = median(values).context("no values")?;
        out.push(Verdict {
            figure,
            baseline: base,
            current,
            passed: current <= base * (1.0 + margin),
        });
    }
    if out.is_empty() {
        bail!("the baseline has none of the gated figures");
    }
    Ok(out)
}

/// A baseline made of `reports`: the median of each gated figure, with the first report's
/// build profile, commit, machine and topology.
pub(crate) fn baseline_of(reports: &[Value]) -> anyhow::Result<Value> {
    let first = reports.first().context("no report to make a baseline of")?;
    let mut out = serde_json::json!({});
    for key in ["commit", "build_profile", "cpus", "topology", "pinned_cpu"] {
        out[key] = first.get(key).cloned().unwrap_or(Value::Null);
    }
    out["reports"] = reports.len().into();
    for figure in FIGURES {
        let values = reports
            .iter()
            .map(|r| r.pointer(figure).and_then(Value::as_f64))
            .collect::<Option<Vec<f64>>>()
            .with_context(|| format!("{figure} is missing from a report"))?;
        let mut at = &mut out;
        let parts: Vec<&str> = figure.trim_start_matches('/').split('/').collect();
        for p in &parts[..parts.len() - 1] {
            at = &mut at[*p];
        }
        at[parts[parts.len() - 1]] = median(values).context("no values")?.into();
    }
    Ok(out)
}

fn read(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Prints each figure's verdict; exits 1 if any regressed beyond the margin. With `write`,
/// writes the reports' medians as the new baseline instead.
pub(crate) fn run(
    baseline: &Path,
    reports: &[PathBuf],
    margin: f64,
    write: bool,
) -> anyhow::Result<ExitCode> {
    let reports = reports
        .iter()
        .map(|p| read(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if write {
        let text = serde_json::to_string_pretty(&baseline_of(&reports)?)? + "\n";
        std::fs::write(baseline, text)
            .with_context(|| format!("writing {}", baseline.display()))?;
        println!(
            "wrote {} (the median of {} report(s))",
            baseline.display(),
            reports.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let base = read(baseline)?;
    let verdicts = judge(&base, &reports, margin)?;
    println!(
        "bench gate: median of {} report(s) against {} (fail above +{:.0}%)",
        reports.len(),
        baseline.display(),
        margin * 100.0
    );
    for v in &verdicts {
        println!(
            "{:<50} baseline {:>10.2} now {:>10.2} ({:+.0}%) {}",
            v.figure.trim_start_matches('/').replace('/', "."),
            v.baseline,
            v.current,
            (v.current / v.baseline - 1.0) * 100.0,
            if v.passed { "ok" } else { "REGRESSED" }
        );
    }
    Ok(if verdicts.iter().all(|v| v.passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn report(gb: f64, rt: f64, conn: f64) -> Value {
        json!({
            "build_profile": "release",
            "arms": {"ferry": {
                "bulk": {"proxy_cpu_s_per_gb": gb},
                "rr_64b": {"proxy_cpu_us_per_round_trip": rt},
                "rr_1kib": {"proxy_cpu_us_per_round_trip": rt},
                "conns": {"proxy_cpu_us_per_conn": conn},
            }},
        })
    }

    #[test]
    fn a_figure_more_than_the_margin_above_its_baseline_fails_and_the_median_decides() {
        let base = report(3.0, 100.0, 800.0);
        let same = judge(&base, &[report(3.0, 100.0, 800.0)], 0.25).unwrap();
        assert_eq!(same.len(), 4);
        assert!(same.iter().all(|v| v.passed));
        // 24% worse passes, 26% worse fails; better always passes.
        let v = judge(&base, &[report(3.72, 126.0, 400.0)], 0.25).unwrap();
        let passed: Vec<bool> = v.iter().map(|v| v.passed).collect();
        assert_eq!(passed, [true, false, false, true]);
        // One noisy run of three is outvoted.
        let v = judge(
            &base,
            &[
                report(3.0, 100.0, 800.0),
                report(9.0, 300.0, 2400.0),
                report(3.1, 101.0, 810.0),
            ],
            0.25,
        )
        .unwrap();
        assert!(v.iter().all(|v| v.passed), "{v:?}");
        assert_eq!(v[0].current, 3.1);
    }

    #[test]
    fn another_build_profile_a_missing_figure_or_nothing_to_judge_is_an_error() {
        let base = report(3.0, 100.0, 800.0);
        let mut debug = report(3.0, 100.0, 800.0);
        debug["build_profile"] = json!("debug");
        assert!(judge(&base, &[debug], 0.25).is_err());
        let mut partial = report(3.0, 100.0, 800.0);
        partial["arms"]["ferry"]
            .as_object_mut()
            .unwrap()
            .remove("conns");
        assert!(judge(&base, &[partial], 0.25).is_err());
        assert!(judge(&base, &[], 0.25).is_err());
        assert!(judge(&json!({"build_profile": "release"}), &[base], 0.25).is_err());
        assert_eq!(median(vec![1.0, 4.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn a_baseline_is_the_median_of_each_figure_and_passes_its_own_reports() {
        let runs = [
            report(3.0, 100.0, 900.0),
            report(9.0, 90.0, 800.0),
            report(4.0, 300.0, 700.0),
        ];
        let base = baseline_of(&runs).unwrap();
        assert_eq!(base["build_profile"], "release");
        assert_eq!(base["reports"], 3);
        assert_eq!(base.pointer(FIGURES[0]).unwrap(), 4.0);
        assert_eq!(base.pointer(FIGURES[1]).unwrap(), 100.0);
        assert_eq!(base.pointer(FIGURES[3]).unwrap(), 800.0);
        assert!(judge(&base, &runs, 0.25).unwrap().iter().all(|v| v.passed));
    }
}
