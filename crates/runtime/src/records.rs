//! The connection records of one process: every access-log line, kept as a structured record
//! in a bounded ring, newest last, served by every admin endpoint at `/records` (JSON lines)
//! for `ferry observe`.
//!
//! One ring per process (a node proxy, a waypoint, a gateway), [`DEFAULT_CAPACITY`] records
//! unless [`configure`]d; a record is its access-log line's fields (a few hundred bytes), so
//! the default ring holds at most about 1 MiB. Pushing takes one short lock; the oldest record
//! is dropped when the ring is full.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

/// Records kept when the program does not say.
pub const DEFAULT_CAPACITY: usize = 1024;

/// One connection as the hop that carried it ended it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Record {
    /// `<process id>-<sequence>`: the same id as the access-log line's `conn.id`.
    pub id: String,
    /// The W3C trace id all hops of the connection share (empty if none travelled).
    pub trace_id: String,
    /// When it ended, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// `outbound`, `inbound`, `waypoint`, `gateway`, ...
    pub direction: String,
    pub src_addr: String,
    pub src_workload: String,
    pub src_identity: String,
    pub dst_addr: String,
    pub dst_hbone_addr: String,
    pub dst_service: String,
    pub dst_workload: String,
    pub dst_identity: String,
    /// The path taken and why.
    pub path: String,
    /// `allowed`, or `denied` when a policy refused or closed it.
    pub verdict: &'static str,
    /// The policy and rule that denied it (`-` when no ALLOW matched), if one did.
    pub policy: String,
    pub rule: String,
    pub response_flags: &'static str,
    pub error: String,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub duration_ms: u64,
}

/// The ring.
#[derive(Debug)]
pub struct Records {
    ring: Mutex<VecDeque<Record>>,
    capacity: AtomicUsize,
    next: AtomicU64,
}

static RECORDS: OnceLock<Records> = OnceLock::new();

/// This process's ring.
pub fn global() -> &'static Records {
    RECORDS.get_or_init(|| Records::new(DEFAULT_CAPACITY))
}

/// Sets how many records this process keeps (0 keeps none).
pub fn configure(capacity: usize) {
    global().capacity.store(capacity, Ordering::Relaxed);
}

// === impl Records ===

impl Records {
    pub fn new(capacity: usize) -> Self {
        Self {
            ring: Mutex::new(VecDeque::new()),
            capacity: AtomicUsize::new(capacity),
            next: AtomicU64::new(1),
        }
    }

    /// A new connection id, unique in this process and across processes of one machine.
    pub fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:x}-{n}", std::process::id())
    }

    /// Whether records are kept at all (a capacity above 0): else none need be built.
    pub fn keeps(&self) -> bool {
        self.capacity.load(Ordering::Relaxed) > 0
    }

    /// Keeps `r`, dropping the oldest record if the ring is full.
    pub fn push(&self, r: Record) {
        let cap = self.capacity.load(Ordering::Relaxed);
        if cap == 0 {
            return;
        }
        let mut ring = self.ring.lock();
        while ring.len() >= cap {
            ring.pop_front();
        }
        ring.push_back(r);
    }

    /// Every record kept, oldest first.
    pub fn snapshot(&self) -> Vec<Record> {
        self.ring.lock().iter().cloned().collect()
    }

    /// The records as JSON lines, oldest first (what `/records` answers).
    pub fn json_lines(&self) -> String {
        let mut out = String::new();
        for r in self.ring.lock().iter() {
            if let Ok(line) = serde_json::to_string(r) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }
}

// === impl Record ===

impl Record {
    /// The bytes this record holds: itself and its strings' buffers.
    pub fn footprint(&self) -> usize {
        std::mem::size_of::<Self>()
            + [
                &self.id,
                &self.trace_id,
                &self.direction,
                &self.src_addr,
                &self.src_workload,
                &self.src_identity,
                &self.dst_addr,
                &self.dst_hbone_addr,
                &self.dst_service,
                &self.dst_workload,
                &self.dst_identity,
                &self.path,
                &self.policy,
                &self.rule,
                &self.error,
            ]
            .iter()
            .map(|s| s.capacity())
            .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as a cross-cluster connection through a waypoint writes it.
    fn typical(i: usize) -> Record {
        Record {
            id: format!("1f2e3-{i}"),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            at_ms: 1_796_164_665_898,
            direction: "outbound".into(),
            src_addr: "198.18.3.20:34428".into(),
            src_workload: "echo-beta-7d9f8c6b5-x2x9q".into(),
            src_identity: "spiffe://cluster.local/ns/default/sa/echo".into(),
            dst_addr: "198.18.3.50:15008".into(),
            dst_hbone_addr: "198.18.10.5:80".into(),
            dst_service: "default/audit.default.svc.cluster.local".into(),
            dst_workload: "beta//v1/Pod/default/audit-waypoint-beta-5c8d7f9b4-q7w2e".into(),
            dst_identity: "spiffe://cluster.local/ns/default/sa/audit-waypoint".into(),
            path: "hbone via waypoint default/audit-waypoint.default.svc.cluster.local".into(),
            verdict: "allowed",
            response_flags: "-",
            ..Record::default()
        }
    }

    #[test]
    fn a_full_ring_of_typical_records_stays_under_its_stated_bound() {
        let r = Records::new(DEFAULT_CAPACITY);
        for i in 0..DEFAULT_CAPACITY * 2 {
            r.push(typical(i));
        }
        let kept = r.snapshot();
        assert_eq!(kept.len(), DEFAULT_CAPACITY);
        let bytes: usize = kept.iter().map(Record::footprint).sum();
        eprintln!("{bytes} bytes for {DEFAULT_CAPACITY} typical records");
        // The documented bound: about 1 MiB at the default size.
        assert!(
            bytes < 1024 * 1024,
            "{bytes} bytes for {DEFAULT_CAPACITY} records"
        );
        assert!(
            bytes > 256 * 1024,
            "the measure counts the strings too: {bytes}"
        );
    }

    #[test]
    fn the_ring_keeps_the_newest_up_to_its_capacity() {
        let r = Records::new(3);
        for i in 0..5 {
            r.push(Record {
                id: format!("x-{i}"),
                ..Record::default()
            });
        }
        let ids: Vec<String> = r.snapshot().into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["x-2", "x-3", "x-4"]);
        assert_eq!(r.json_lines().lines().count(), 3);
        r.capacity.store(0, Ordering::Relaxed);
        r.push(Record::default());
        assert_eq!(r.snapshot().len(), 3, "a ring of 0 keeps nothing new");
        assert_ne!(r.next_id(), r.next_id());
    }
}
