//! Passive health, plumbed: the outbound path reports each connect outcome to a landing (an
//! endpoint or a waypoint instance); [`ferry_core::outlier::Outliers`] decides; the ejected set
//! is published whole as an `Arc` ([`arc_swap`]) that each connection's plan reads without a
//! lock. Only a reported outcome, or an ejection whose time is over, takes the lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use ferry_core::model::WorkloadUid;
use ferry_core::outlier::{Ejected, OutlierConfig, Outliers, Verdict};
use ferry_core::snapshot::Snapshot;
use ferry_runtime::telemetry::registered;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The ejections in force, as the data path reads them.
#[derive(Debug, Default)]
pub(crate) struct Published {
    pub(crate) ejected: Ejected,
    /// When the first of them ends: the next read after it ends them.
    next_return: Option<Instant>,
}

/// The node's outlier detection.
#[derive(Debug)]
pub(crate) struct PassiveHealth {
    machine: Mutex<Outliers>,
    /// Whether `machine` holds any record: a success with none skips the lock.
    tracked: AtomicBool,
    published: ArcSwap<Published>,
    /// `ferry_outlier_ejections_total`.
    ejections: Counter,
    /// `ferry_outlier_ejected`: endpoints ejected now.
    ejected_now: Gauge,
}

// === impl PassiveHealth ===

impl PassiveHealth {
    pub(crate) fn new(config: OutlierConfig, registry: &mut Registry) -> Self {
        Self {
            machine: Mutex::new(Outliers::new(config)),
            tracked: AtomicBool::new(false),
            published: ArcSwap::from_pointee(Published::default()),
            ejections: registered(
                registry,
                "ferry_outlier_ejections",
                "Endpoints ejected by outlier detection (connects failed in a row)",
            ),
            ejected_now: registered(
                registry,
                "ferry_outlier_ejected",
                "Endpoints ejected by outlier detection now",
            ),
        }
    }

    /// The ejections in force at `now`: a lock-free read, unless one has just ended.
    pub(crate) fn current(&self, now: Instant) -> Arc<Published> {
        let p = self.published.load_full();
        if p.next_return.is_none_or(|t| t > now) {
            return p;
        }
        let mut m = self.machine.lock();
        for uid in m.expire(now) {
            tracing::info!(dst.workload = %uid, "outlier detection: endpoint back in picks");
        }
        self.publish(&m)
    }

    /// A connect to `uid` succeeded.
    pub(crate) fn success(&self, uid: &WorkloadUid) {
        if !self.tracked.load(Ordering::Relaxed) {
            return;
        }
        let mut m = self.machine.lock();
        m.success(uid);
        self.tracked.store(!m.is_empty(), Ordering::Relaxed);
    }

    /// A retryable connect failure to `uid`, judged in `snap`.
    pub(crate) fn failure(&self, snap: &Snapshot, uid: &WorkloadUid, now: Instant) {
        let mut m = self.machine.lock();
        m.retain_known(snap);
        let verdict = m.failure(snap, uid, now);
        self.tracked.store(!m.is_empty(), Ordering::Relaxed);
        match verdict {
            Verdict::Ejected { duration, times } => {
                self.ejections.inc();
                tracing::info!(dst.workload = %uid, outlier.seconds = duration.as_secs(), outlier.times = times, "outlier detection: endpoint ejected after connects failed in a row");
                self.publish(&m);
            }
            Verdict::CapReached { failures } => {
                tracing::debug!(dst.workload = %uid, outlier.failures = failures, "outlier detection: not ejected, the share of its service's endpoints ejected is at its cap");
            }
            Verdict::Counted { .. } | Verdict::AlreadyEjected => {}
        }
    }

    /// What `/config_dump` shows.
    pub(crate) fn dump(&self) -> serde_json::Value {
        let m = self.machine.lock();
        let c = m.config();
        serde_json::json!({
            "consecutive_failures": c.consecutive_failures,
            "base_ejection_seconds": c.base_ejection.as_secs(),
            "max_ejection_seconds": c.max_ejection.as_secs(),
            "max_ejected_percent": c.max_ejected_percent,
            "ejected": self.published.load().ejected.iter().map(ToString::to_string).collect::<Vec<_>>(),
        })
    }

    fn publish(&self, m: &Outliers) -> Arc<Published> {
        let p = Arc::new(Published {
            ejected: m.ejected(),
            next_return: m.next_return(),
        });
        self.ejected_now
            .set(i64::try_from(p.ejected.len()).unwrap_or(i64::MAX));
        self.published.store(p.clone());
        p
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ferry_core::testing::MeshBuilder;

    use super::*;

    /// Service echo with three endpoints.
    fn snap() -> Snapshot {
        let mut m = MeshBuilder::new();
        m.cluster("c", "net").node("n1", "c", "r/z/s");
        m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
        for i in 0..3 {
            let name = format!("echo-{i}");
            m.pod(&name, "n1", &format!("198.18.1.{}", 10 + i));
            m.backs(&name, "echo");
        }
        m.build()
    }

    fn metric(registry: &Registry, name: &str) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    }

    #[test]
    fn failures_publish_the_ejection_until_its_time_is_over() {
        let mut registry = Registry::default();
        let h = PassiveHealth::new(OutlierConfig::default(), &mut registry);
        let snap = snap();
        let uid = WorkloadUid::new("c//v1/Pod/default/echo-0");
        let t0 = Instant::now();
        h.success(&uid);
        for _ in 0..4 {
            h.failure(&snap, &uid, t0);
        }
        assert!(h.current(t0).ejected.is_empty());
        h.failure(&snap, &uid, t0);
        assert!(h.current(t0).ejected.contains(&uid));
        assert_eq!(metric(&registry, "ferry_outlier_ejections_total"), "1");
        assert_eq!(metric(&registry, "ferry_outlier_ejected"), "1");
        assert_eq!(h.dump()["ejected"][0], uid.to_string());
        // Read again before its end: the same published set, no change.
        assert!(
            h.current(t0 + Duration::from_secs(29))
                .ejected
                .contains(&uid)
        );
        // At its end, the next read ends it.
        assert!(h.current(t0 + Duration::from_secs(30)).ejected.is_empty());
        assert_eq!(metric(&registry, "ferry_outlier_ejected"), "0");
        assert_eq!(metric(&registry, "ferry_outlier_ejections_total"), "1");
    }
}
