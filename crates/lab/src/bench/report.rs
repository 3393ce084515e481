//! What `ferry lab bench` found, as figures with their units in their names: printed as a
//! table, and written as JSON (`--json`) so runs can be compared (and gated, [`super::gate`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::client::Sample;

/// Everything one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Report {
    /// `git rev-parse HEAD` where the run was started, if that is a checkout.
    pub(crate) commit: Option<String>,
    /// `debug` or `release`: the build that ran (the gate compares only like with like).
    pub(crate) build_profile: String,
    /// CPUs this machine offers.
    pub(crate) cpus: usize,
    pub(crate) topology: Topology,
    /// The CPU the latency measures were pinned to (client, both node proxies, server app).
    pub(crate) pinned_cpu: Option<usize>,
    /// By arm: `direct`, `ferry`.
    pub(crate) arms: BTreeMap<String, Arm>,
    /// The Ferry arm against the direct one, when both ran.
    pub(crate) ferry_vs_direct: Option<Ratios>,
    pub(crate) memory: Option<Memory>,
}

/// Where the run was.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Topology {
    /// The lab's topology file.
    pub(crate) file: String,
    pub(crate) from_pod: String,
    pub(crate) from_node: String,
    pub(crate) from_ip: String,
    pub(crate) to_pod: String,
    pub(crate) to_node: String,
    pub(crate) to_ip: String,
    /// The node proxies whose CPU and counters are read: node name -> pid.
    pub(crate) node_proxies: BTreeMap<String, u32>,
}

/// One arm's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Arm {
    /// What a connection of this arm crosses.
    pub(crate) crosses: String,
    pub(crate) bulk: Option<Bulk>,
    pub(crate) rr_64b: Option<RoundTrips>,
    pub(crate) rr_1kib: Option<RoundTrips>,
    pub(crate) conns: Option<Conns>,
    /// New connections again, from several client threads at once (`--conn-threads`).
    pub(crate) conns_threads: Option<Conns>,
    /// `istio_tcp_connections_opened_total` moves at each node proxy over the arm's measures:
    /// all zero on the direct arm, or it was not direct.
    pub(crate) proxy_connections_opened: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Bulk {
    pub(crate) mib: u64,
    pub(crate) gbit_per_s: f64,
    /// Both node proxies' utime+stime over the transfer.
    pub(crate) proxy_cpu_s: f64,
    pub(crate) proxy_cpu_s_per_gb: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct RoundTrips {
    pub(crate) size_bytes: usize,
    pub(crate) count: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) proxy_cpu_us_per_round_trip: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Conns {
    /// Client threads opening them.
    pub(crate) threads: usize,
    pub(crate) count: u64,
    pub(crate) per_s: f64,
    pub(crate) proxy_cpu_us_per_conn: f64,
}

/// Ferry against direct, same run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Ratios {
    pub(crate) bulk_throughput_x: f64,
    pub(crate) conns_per_s_x: f64,
    /// With `--conn-threads` client threads (when measured on both arms).
    pub(crate) conns_threads_per_s_x: Option<f64>,
    pub(crate) rr_64b_added_p50_us: f64,
    pub(crate) rr_64b_added_p99_us: f64,
    pub(crate) rr_1kib_added_p50_us: f64,
    pub(crate) rr_1kib_added_p99_us: f64,
}

/// Node proxy memory: idle on quiet processes before any load, with idle proxied connections
/// held, and once they closed and the processes were quiet again.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Memory {
    /// Whether the proxies were quiet (CPU and RSS steady) when idle was read, and how long
    /// that took.
    pub(crate) idle_quiet: bool,
    pub(crate) idle_wait_s: f64,
    pub(crate) idle_rss_kib: BTreeMap<String, u64>,
    pub(crate) held_conns: usize,
    pub(crate) held_rss_kib: BTreeMap<String, u64>,
    /// (held − idle) summed over both node proxies, per held connection.
    pub(crate) kib_per_idle_conn_both_ends: f64,
    /// The anonymous part of `held_rss_kib` (`RssAnon`).
    #[serde(default)]
    pub(crate) held_anon_kib: BTreeMap<String, u64>,
    /// (held − idle) of the anonymous memory alone, summed over both node proxies, per held
    /// connection: what each connection costs, whatever of the binary's pages the idle
    /// proxies had given back (the RSS difference counts those too).
    #[serde(default)]
    pub(crate) anon_kib_per_idle_conn_both_ends: f64,
    /// How many were held first, and the RSS then: the rest were added to those, so what
    /// they added is what a connection costs once the code that serves connections is
    /// resident (the idle proxies may have given its pages back, which `held − idle` counts).
    #[serde(default)]
    pub(crate) first_conns: usize,
    #[serde(default)]
    pub(crate) first_rss_kib: BTreeMap<String, u64>,
    /// (held − first) summed over both node proxies, per connection added after the first.
    #[serde(default)]
    pub(crate) marginal_kib_per_idle_conn_both_ends: f64,
    pub(crate) after_close_quiet: bool,
    pub(crate) after_close_wait_s: f64,
    pub(crate) after_close_rss_kib: BTreeMap<String, u64>,
    /// Summed RSS after they closed over summed idle RSS.
    pub(crate) after_close_vs_idle_x: f64,
    /// The anonymous part of the idle RSS (heap, stacks, written data): the rest is the
    /// binary's pages, shared by every process that runs it.
    #[serde(default)]
    pub(crate) idle_anon_kib: BTreeMap<String, u64>,
    /// Seconds after they closed when RSS was read again (0: not read).
    #[serde(default)]
    pub(crate) settled_after_s: u64,
    #[serde(default)]
    pub(crate) settled_rss_kib: BTreeMap<String, u64>,
    #[serde(default)]
    pub(crate) settled_anon_kib: BTreeMap<String, u64>,
    /// Summed RSS `settled_after_s` after they closed over summed idle RSS.
    #[serde(default)]
    pub(crate) settled_vs_idle_x: f64,
}

// === figures from samples ===

/// Bulk figures from the sink's byte count and the proxies' CPU over the transfer.
pub(crate) fn bulk(s: &Sample, cpu_s: f64) -> Bulk {
    let gb = s.bytes as f64 / 1e9;
    Bulk {
        mib: s.units,
        gbit_per_s: if s.secs > 0.0 { gb * 8.0 / s.secs } else { 0.0 },
        proxy_cpu_s: cpu_s,
        proxy_cpu_s_per_gb: if gb > 0.0 { cpu_s / gb } else { 0.0 },
    }
}

pub(crate) fn round_trips(s: &Sample, size_bytes: usize, cpu_s: f64) -> RoundTrips {
    RoundTrips {
        size_bytes,
        count: s.units,
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        proxy_cpu_us_per_round_trip: per_unit_us(cpu_s, s.units),
    }
}

pub(crate) fn conns(s: &Sample, threads: usize, cpu_s: f64) -> Conns {
    Conns {
        threads,
        count: s.units,
        per_s: if s.secs > 0.0 {
            s.units as f64 / s.secs
        } else {
            0.0
        },
        proxy_cpu_us_per_conn: per_unit_us(cpu_s, s.units),
    }
}

fn per_unit_us(cpu_s: f64, units: u64) -> f64 {
    if units == 0 {
        0.0
    } else {
        cpu_s * 1e6 / units as f64
    }
}

/// Ferry against direct, when both arms measured everything.
pub(crate) fn ratios(direct: &Arm, ferry: &Arm) -> Option<Ratios> {
    let (db, fb) = (direct.bulk?, ferry.bulk?);
    let (dc, fc) = (direct.conns?, ferry.conns?);
    let (d64, f64_) = (direct.rr_64b?, ferry.rr_64b?);
    let (d1k, f1k) = (direct.rr_1kib?, ferry.rr_1kib?);
    let x = |f: f64, d: f64| if d > 0.0 { f / d } else { 0.0 };
    Some(Ratios {
        bulk_throughput_x: x(fb.gbit_per_s, db.gbit_per_s),
        conns_per_s_x: x(fc.per_s, dc.per_s),
        conns_threads_per_s_x: match (direct.conns_threads, ferry.conns_threads) {
            (Some(d), Some(f)) => Some(x(f.per_s, d.per_s)),
            _ => None,
        },
        rr_64b_added_p50_us: f64_.p50_us - d64.p50_us,
        rr_64b_added_p99_us: f64_.p99_us - d64.p99_us,
        rr_1kib_added_p50_us: f1k.p50_us - d1k.p50_us,
        rr_1kib_added_p99_us: f1k.p99_us - d1k.p99_us,
    })
}

/// Memory figures from RSS per node proxy: idle, held, after.
pub(crate) fn memory_figures(m: &mut Memory) {
    let sum = |v: &BTreeMap<String, u64>| v.values().sum::<u64>() as f64;
    let (idle, held, after) = (
        sum(&m.idle_rss_kib),
        sum(&m.held_rss_kib),
        sum(&m.after_close_rss_kib),
    );
    m.kib_per_idle_conn_both_ends = if m.held_conns > 0 {
        (held - idle).max(0.0) / m.held_conns as f64
    } else {
        0.0
    };
    let (idle_anon, held_anon) = (sum(&m.idle_anon_kib), sum(&m.held_anon_kib));
    m.anon_kib_per_idle_conn_both_ends = if m.held_conns > 0 && held_anon > 0.0 {
        (held_anon - idle_anon).max(0.0) / m.held_conns as f64
    } else {
        0.0
    };
    let first = sum(&m.first_rss_kib);
    let added = m.held_conns.saturating_sub(m.first_conns);
    m.marginal_kib_per_idle_conn_both_ends = if added > 0 && first > 0.0 {
        (held - first).max(0.0) / added as f64
    } else {
        0.0
    };
    m.after_close_vs_idle_x = if idle > 0.0 { after / idle } else { 0.0 };
    let settled = sum(&m.settled_rss_kib);
    m.settled_vs_idle_x = if idle > 0.0 && settled > 0.0 {
        settled / idle
    } else {
        0.0
    };
}

// === impl Report ===

impl Report {
    /// The report as the table `ferry lab bench` prints.
    pub(crate) fn text(&self) -> String {
        let mut o = String::new();
        let t = &self.topology;
        let _ = writeln!(
            o,
            "ferry lab bench: {} ({}, {}) -> {} ({}, {}){}",
            t.from_pod,
            t.from_node,
            t.from_ip,
            t.to_pod,
            t.to_node,
            t.to_ip,
            self.commit
                .as_deref()
                .map(|c| format!(", commit {}", &c[..c.len().min(12)]))
                .unwrap_or_default()
        );
        for (name, arm) in &self.arms {
            let _ = writeln!(o, "  {name:<7} crosses: {}", arm.crosses);
        }
        let proxies: Vec<String> = t
            .node_proxies
            .iter()
            .map(|(n, p)| format!("{n} pid {p}"))
            .collect();
        let _ = writeln!(
            o,
            "  proxy CPU = utime+stime of the node proxies ({}) from /proc/<pid>/stat over each measure",
            proxies.join(", ")
        );
        let _ = writeln!(
            o,
            "  round trips {}",
            match self.pinned_cpu {
                Some(c) =>
                    format!("pinned: client, both node proxies and the server app on CPU {c}"),
                None => "unpinned (--pinned pins them to one CPU)".into(),
            }
        );
        if let Some(m) = &self.memory {
            memory_text(&mut o, m);
        }
        let _ = writeln!(
            o,
            "{:<16} {:>26} {:>26}   {:>22}",
            "measure", "direct", "ferry", "ferry vs direct"
        );
        let arm = |n: &str| self.arms.get(n);
        let (d, f) = (arm("direct"), arm("ferry"));
        let r = self.ferry_vs_direct;
        let cell = |a: Option<&Arm>, pick: &dyn Fn(&Arm) -> Option<String>| {
            a.and_then(pick).unwrap_or_else(|| "-".into())
        };
        let row =
            |o: &mut String, what: &str, pick: &dyn Fn(&Arm) -> Option<String>, ratio: String| {
                let _ = writeln!(
                    o,
                    "{what:<16} {:>26} {:>26}   {ratio:>22}",
                    cell(d, pick),
                    cell(f, pick)
                );
            };
        row(
            &mut o,
            "bulk",
            &|a| a.bulk.map(|b| format!("{:.2} Gb/s", b.gbit_per_s)),
            r.map(|r| format!("{:.2}x", r.bulk_throughput_x))
                .unwrap_or_default(),
        );
        row(
            &mut o,
            "  proxy CPU",
            &|a| a.bulk.map(|b| format!("{:.2} s/GB", b.proxy_cpu_s_per_gb)),
            String::new(),
        );
        for (label, pick, added) in [
            (
                "rr 64 B p50/p99",
                (|a: &Arm| a.rr_64b) as fn(&Arm) -> Option<RoundTrips>,
                r.map(|r| (r.rr_64b_added_p50_us, r.rr_64b_added_p99_us)),
            ),
            (
                "rr 1 KiB p50/p99",
                |a: &Arm| a.rr_1kib,
                r.map(|r| (r.rr_1kib_added_p50_us, r.rr_1kib_added_p99_us)),
            ),
        ] {
            row(
                &mut o,
                label,
                &|a| pick(a).map(|x| format!("{:.0}/{:.0} us", x.p50_us, x.p99_us)),
                added
                    .map(|(p50, p99)| format!("added {p50:+.0}/{p99:+.0} us"))
                    .unwrap_or_default(),
            );
            row(
                &mut o,
                "  proxy CPU",
                &|a| pick(a).map(|x| format!("{:.0} us/rt", x.proxy_cpu_us_per_round_trip)),
                String::new(),
            );
        }
        row(
            &mut o,
            "new conns",
            &|a| a.conns.map(|c| format!("{:.0}/s", c.per_s)),
            r.map(|r| format!("{:.2}x", r.conns_per_s_x))
                .unwrap_or_default(),
        );
        row(
            &mut o,
            "  proxy CPU",
            &|a| {
                a.conns
                    .map(|c| format!("{:.0} us/conn", c.proxy_cpu_us_per_conn))
            },
            String::new(),
        );
        if let Some(n) = f.or(d).and_then(|a| a.conns_threads).map(|c| c.threads) {
            row(
                &mut o,
                &format!("new conns x{n}"),
                &|a| a.conns_threads.map(|c| format!("{:.0}/s", c.per_s)),
                r.and_then(|r| r.conns_threads_per_s_x)
                    .map(|x| format!("{x:.2}x"))
                    .unwrap_or_default(),
            );
            row(
                &mut o,
                "  proxy CPU",
                &|a| {
                    a.conns_threads
                        .map(|c| format!("{:.0} us/conn", c.proxy_cpu_us_per_conn))
                },
                String::new(),
            );
        }
        row(
            &mut o,
            "proxy conns",
            &|a| {
                Some(
                    a.proxy_connections_opened
                        .iter()
                        .map(|(n, c)| format!("{n} +{c}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                )
            },
            "(opened, per node proxy)".into(),
        );
        o
    }
}

pub(crate) fn memory_text(o: &mut String, m: &Memory) {
    let list = |v: &BTreeMap<String, u64>| {
        v.iter()
            .map(|(n, k)| format!("{n} {k} KiB"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        o,
        "memory: idle RSS {} ({} after {:.1} s); of it anonymous {}",
        list(&m.idle_rss_kib),
        if m.idle_quiet { "quiet" } else { "NOT quiet" },
        m.idle_wait_s,
        list(&m.idle_anon_kib)
    );
    let _ = writeln!(
        o,
        "  {} idle proxied connections held: {}: {:.2} KiB per idle connection, both ends; anonymous {}: {:.2} KiB per idle connection",
        m.held_conns,
        list(&m.held_rss_kib),
        m.kib_per_idle_conn_both_ends,
        list(&m.held_anon_kib),
        m.anon_kib_per_idle_conn_both_ends
    );
    if m.first_conns > 0 && m.marginal_kib_per_idle_conn_both_ends > 0.0 {
        let _ = writeln!(
            o,
            "  {} held first: {}; the {} added to them: {:.2} KiB per idle connection, both ends",
            m.first_conns,
            list(&m.first_rss_kib),
            m.held_conns - m.first_conns,
            m.marginal_kib_per_idle_conn_both_ends
        );
    }
    let _ = writeln!(
        o,
        "  after they closed: {} ({:.2}x idle; {} after {:.1} s)",
        list(&m.after_close_rss_kib),
        m.after_close_vs_idle_x,
        if m.after_close_quiet {
            "quiet"
        } else {
            "NOT quiet"
        },
        m.after_close_wait_s
    );
    if m.settled_after_s > 0 {
        let _ = writeln!(
            o,
            "  {} s after they closed: {} ({:.2}x idle); of it anonymous {}",
            m.settled_after_s,
            list(&m.settled_rss_kib),
            m.settled_vs_idle_x,
            list(&m.settled_anon_kib)
        );
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
