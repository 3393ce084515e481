//! The node proxies a benchmark watches (the source pod's and the destination pod's): their
//! CPU, and their connection counters, read around each measure.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, bail};

use crate::procs::{cpu_ticks, ticks_per_second};
use crate::state::{NodeProc, Pod, State};

/// The node proxies of two pods (one when both are on one node).
#[derive(Debug)]
pub(crate) struct Proxies<'a> {
    nodes: BTreeMap<String, &'a NodeProc>,
}

// === impl Proxies ===

impl<'a> Proxies<'a> {
    pub(crate) fn of(state: &'a State, src: &Pod, dst: &Pod) -> anyhow::Result<Self> {
        let mut nodes = BTreeMap::new();
        for pod in [src, dst] {
            let name = pod.node.as_deref().context("a pod without a node")?;
            nodes.insert(name.to_string(), state.node(name)?);
        }
        Ok(Self { nodes })
    }

    /// Node name -> pid.
    pub(crate) fn pids(&self) -> BTreeMap<String, u32> {
        self.nodes.iter().map(|(n, p)| (n.clone(), p.pid)).collect()
    }

    /// The summed user and system CPU of every one of them so far, in seconds.
    pub(crate) fn cpu_s(&self) -> f64 {
        let ticks: u64 = self.nodes.values().map(|p| cpu_ticks(p.pid)).sum();
        ticks as f64 / ticks_per_second() as f64
    }

    /// `istio_tcp_connections_opened_total` (every label set) of each, from its `/metrics`.
    pub(crate) fn opened(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let exe = std::env::current_exe()?;
        let mut out = BTreeMap::new();
        for (name, p) in &self.nodes {
            let got = Command::new("ip")
                .args(["netns", "exec", &p.netns])
                .arg(&exe)
                .args(["lab", "connect", &p.admin, "--data"])
                .arg("GET /metrics HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n")
                .output()?;
            let scrape = String::from_utf8_lossy(&got.stdout);
            if !scrape.starts_with("HTTP/1.1 200") {
                bail!(
                    "reading /metrics of node proxy {name} at {}: {scrape:?}",
                    p.admin
                );
            }
            out.insert(name.clone(), opened_total(&scrape));
        }
        Ok(out)
    }
}

/// The sum of `istio_tcp_connections_opened_total` over its label sets in a scrape (0 before
/// the first connection).
pub(crate) fn opened_total(scrape: &str) -> u64 {
    scrape
        .lines()
        .filter(|l| {
            l.strip_prefix("istio_tcp_connections_opened_total")
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// How much each counter moved from `before` to `after`.
pub(crate) fn moved(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(n, a)| {
            (
                n.clone(),
                a.saturating_sub(before.get(n).copied().unwrap_or(0)),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opened_counter_is_summed_over_its_label_sets_and_nothing_else() {
        let scrape = "HTTP/1.1 200 OK\r\n\r\n\
# HELP istio_tcp_connections_opened TCP connections opened.\n\
# TYPE istio_tcp_connections_opened counter\n\
istio_tcp_connections_opened_total{reporter=\"source\",x=\"a b\"} 5\n\
istio_tcp_connections_opened_total{reporter=\"destination\"} 7\n\
istio_tcp_connections_opened_totalx 100\n\
istio_tcp_connections_closed_total{reporter=\"source\"} 4\n";
        assert_eq!(opened_total(scrape), 12);
        assert_eq!(opened_total("HTTP/1.1 200 OK\r\n\r\n"), 0);
        let at = |a: u64, b: u64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
        assert_eq!(moved(&at(5, 7), &at(5, 9)), at(0, 2));
    }
}
