//! Passive health (outlier detection), per node proxy: a pure state machine, time passed in.
//!
//! The node's outbound path reports each connect outcome to an endpoint (or waypoint instance):
//! a success, or a failure the retry rule calls retryable (refused, reset or timed out, a TLS or
//! HTTP/2 handshake failure, HBONE 502/503/504). After [`OutlierConfig::consecutive_failures`]
//! failures in a row the endpoint is ejected: routing skips it (the trace says "ejected") for
//! `base_ejection` times the number of times it has been ejected, at most `max_ejection`. A
//! success resets the count. Ejection never takes more than `max_ejected_percent` of the
//! endpoints of any service the endpoint backs (so never a service's only endpoint at 50%),
//! and, being a filter inside the same decision, never moves a pick out of the service's scope.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::WorkloadUid;
use crate::snapshot::{Endpoint, Snapshot};

/// The rules' parameters (Envoy's outlier detection: `consecutive_gateway_failure`,
/// `base_ejection_time`, `max_ejection_time`, `max_ejection_percent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OutlierConfig {
    /// Failures in a row that eject an endpoint; 0 turns ejection off.
    pub consecutive_failures: u32,
    /// The first ejection's length; the k-th lasts k times this.
    pub base_ejection: Duration,
    /// No ejection lasts longer.
    pub max_ejection: Duration,
    /// At most this share (percent) of a service's endpoints is ejected at once.
    pub max_ejected_percent: u8,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
        }
    }
}

/// The endpoints ejected now: what the routing decision reads (the node proxy swaps an `Arc`
/// of it whole, so the data path reads it without a lock).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Ejected(BTreeSet<WorkloadUid>);

// === impl Ejected ===

impl Ejected {
    /// No ejection in force.
    pub const NONE: Self = Self(BTreeSet::new());

    pub fn contains(&self, uid: &WorkloadUid) -> bool {
        self.0.contains(uid)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &WorkloadUid> {
        self.0.iter()
    }
}

impl FromIterator<WorkloadUid> for Ejected {
    fn from_iter<I: IntoIterator<Item = WorkloadUid>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// What one reported failure did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Counted; `failures` in a row so far.
    Counted { failures: u32 },
    /// Ejected for `duration` (its `times`-th ejection).
    Ejected { duration: Duration, times: u32 },
    /// Enough failures, but ejecting it would take more than the allowed share of a service's
    /// endpoints: it stays in.
    CapReached { failures: u32 },
    /// Already ejected (a connect that was under way when it was ejected).
    AlreadyEjected,
}

/// One endpoint's record.
#[derive(Clone, Copy, Debug, Default)]
struct Record {
    /// Retryable connect failures in a row.
    failures: u32,
    /// How many times it has been ejected (the backoff multiplier).
    times: u32,
    /// Ejected until then.
    until: Option<Instant>,
    /// When its last ejection ended.
    returned: Option<Instant>,
}

/// Every endpoint's record, and the rules.
#[derive(Clone, Debug)]
pub struct Outliers {
    config: OutlierConfig,
    records: HashMap<WorkloadUid, Record>,
}

// === impl Outliers ===

impl Outliers {
    pub fn new(config: OutlierConfig) -> Self {
        Self {
            config,
            records: HashMap::new(),
        }
    }

    pub fn config(&self) -> &OutlierConfig {
        &self.config
    }

    /// Whether no endpoint has a record (no failure counted, no ejection to remember): a
    /// success then has nothing to reset.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// A connect to `uid` succeeded: its count of failures in a row restarts. Returns whether
    /// anything changed.
    pub fn success(&mut self, uid: &WorkloadUid) -> bool {
        let Some(r) = self.records.get_mut(uid) else {
            return false;
        };
        let changed = r.failures != 0;
        r.failures = 0;
        if r.times == 0 && r.until.is_none() {
            self.records.remove(uid);
        }
        changed
    }

    /// A retryable connect failure to `uid` at `now`, judged against the services it backs in
    /// `snap` (for the share cap).
    pub fn failure(&mut self, snap: &Snapshot, uid: &WorkloadUid, now: Instant) -> Verdict {
        self.expire(now);
        let config = self.config;
        let r = self.records.entry(uid.clone()).or_default();
        if r.until.is_some() {
            return Verdict::AlreadyEjected;
        }
        r.failures = r.failures.saturating_add(1);
        let failures = r.failures;
        if config.consecutive_failures == 0 || failures < config.consecutive_failures {
            return Verdict::Counted { failures };
        }
        if !self.share_allows(snap, uid) {
            return Verdict::CapReached { failures };
        }
        let Some(r) = self.records.get_mut(uid) else {
            return Verdict::Counted { failures };
        };
        // Stable for a whole `max_ejection` since it came back: the backoff starts over.
        if r.returned
            .is_some_and(|t| now.duration_since(t) >= config.max_ejection)
        {
            r.times = 0;
        }
        r.times = r.times.saturating_add(1);
        let duration = config
            .base_ejection
            .saturating_mul(r.times)
            .min(config.max_ejection);
        r.until = Some(now + duration);
        r.failures = 0;
        Verdict::Ejected {
            duration,
            times: r.times,
        }
    }

    /// Ends the ejections whose time is over at `now`; returns the endpoints that came back.
    pub fn expire(&mut self, now: Instant) -> Vec<WorkloadUid> {
        let mut back = Vec::new();
        for (uid, r) in &mut self.records {
            if r.until.is_some_and(|u| u <= now) {
                r.until = None;
                r.returned = Some(now);
                back.push(uid.clone());
            }
        }
        back.sort();
        back
    }

    /// The endpoints ejected now (as of the last [`Outliers::failure`] or
    /// [`Outliers::expire`]).
    pub fn ejected(&self) -> Ejected {
        self.records
            .iter()
            .filter(|(_, r)| r.until.is_some())
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// The earliest time an ejection ends, if any is in force (when to call `expire` next).
    pub fn next_return(&self) -> Option<Instant> {
        self.records.values().filter_map(|r| r.until).min()
    }

    /// Forgets endpoints `snap` no longer has (their records cannot matter again).
    pub fn retain_known(&mut self, snap: &Snapshot) {
        self.records.retain(|uid, _| snap.workload(uid).is_some());
    }

    /// Whether ejecting `uid` keeps every service it backs within the share cap: after it,
    /// at most `max_ejected_percent` of that service's endpoints are ejected.
    fn share_allows(&self, snap: &Snapshot, uid: &WorkloadUid) -> bool {
        let Some(w) = snap.workload(uid) else {
            return false;
        };
        let pct = u64::from(self.config.max_ejected_percent.min(100));
        w.services.keys().all(|key| {
            let endpoints = snap.endpoints(key);
            let total = endpoints.len() as u64;
            let ejected = endpoints
                .iter()
                .filter(|e| match e {
                    Endpoint::Workload(u) => self.records.get(u).is_some_and(|r| r.until.is_some()),
                    Endpoint::Address(_) => false,
                })
                .count() as u64;
            (ejected + 1) * 100 <= total * pct
        })
    }
}

#[cfg(test)]
#[path = "outlier_tests.rs"]
mod tests;
