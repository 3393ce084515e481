//! The connection records of one process: every access-log line, kept as a structured record
//! in a bounded ring, newest last, served by every admin endpoint at `/records` (JSON lines)
//! for `ferry observe`.
//!
//! One ring per process (a node proxy, a waypoint, a gateway), [`DEFAULT_CAPACITY`] records
//! unless [`configure`]d; a record is its access-log line's fields (a few hundred bytes),
//! kept compact ([`kept`]: what a record shares with recent ones is kept once), so the
//! default ring of a spike's records holds under 192 KiB (from IPv4 sources; 256 KiB from IPv6
//! ones, whose own strings do not fit in a slot), and of records that share nothing
//! under 1.5 MiB. Pushing takes one short lock; the oldest record is
//! dropped when the ring is full.
//!
//! A [`Follower`] ([`Records::follow`]) gets every record pushed after it subscribed, as the
//! admin endpoint's `/records?follow=1` streams them. Records are cloned for followers only
//! while one exists (one atomic load per push otherwise), once per push whatever their number,
//! and the followers' channel is made by the first and dropped at the first push after the
//! last one left. A follower that falls more than [`FOLLOW_BUFFER`] records behind is told how
//! many it missed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::broadcast;

use kept::{Interner, Kept};

mod kept;

/// Records kept when the program does not say.
pub const DEFAULT_CAPACITY: usize = 1024;

/// How many records a follower may fall behind by before it misses some.
pub const FOLLOW_BUFFER: usize = 1024;

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
    /// The cluster of the source, as this hop knows it (proven by a certificate past the
    /// first hop); empty when unknown.
    pub src_cluster: String,
    pub dst_addr: String,
    pub dst_hbone_addr: String,
    pub dst_service: String,
    pub dst_workload: String,
    pub dst_identity: String,
    /// The cluster of the workload it landed on; empty when none.
    pub dst_cluster: String,
    /// The path taken and why.
    pub path: String,
    /// The routing decision in short: the class, the candidates set aside and why, the pick
    /// and the transport (at most a fixed number of steps; empty at hops that do not route).
    pub route: String,
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
    /// Phases, in microseconds from the connection's start (0 when the phase did not happen):
    /// the routing decision taken, the next hop reached (its tunnel up for HBONE), the TLS
    /// handshake of a new HBONE connection (0 when a pooled one carried it), the first byte
    /// back from the destination.
    pub decision_us: u64,
    pub connect_us: u64,
    pub tls_us: u64,
    pub first_byte_us: u64,
}

/// The ring.
#[derive(Debug)]
pub struct Records {
    ring: Mutex<Ring>,
    capacity: AtomicUsize,
    next: AtomicU64,
    /// How many [`Follower`]s exist: a push clones its record only if one does.
    followers: Arc<AtomicUsize>,
}

/// What the lock guards: the records kept and the followers' channel, so that a follower gets
/// exactly the records pushed after the ones it was given when it subscribed.
#[derive(Debug, Default)]
struct Ring {
    kept: VecDeque<Kept>,
    /// What new records share their strings with.
    interner: Interner,
    /// Made by the first follower, dropped by the first push after the last one left.
    live: Option<broadcast::Sender<Arc<Record>>>,
}

/// A subscription to the records pushed after it was made ([`Records::follow`]); dropping it
/// unsubscribes.
#[derive(Debug)]
pub struct Follower {
    rx: broadcast::Receiver<Arc<Record>>,
    followers: Arc<AtomicUsize>,
}

/// What a [`Follower`] gets next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// A record pushed after the previous one.
    Record(Arc<Record>),
    /// This many records were pushed while the follower was too far behind to get them.
    Lagged(u64),
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
            ring: Mutex::new(Ring::default()),
            capacity: AtomicUsize::new(capacity),
            next: AtomicU64::new(1),
            followers: Arc::new(AtomicUsize::new(0)),
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

    /// Keeps `r`, dropping the oldest record if the ring is full, and hands it to every
    /// follower.
    pub fn push(&self, r: Record) {
        let cap = self.capacity.load(Ordering::Relaxed);
        if cap == 0 {
            return;
        }
        let mut ring = self.ring.lock();
        let kept = Kept::new(&r, &mut ring.interner);
        if self.followers.load(Ordering::Acquire) > 0 {
            if let Some(live) = &ring.live {
                // No receiver left (the last one is being dropped) is no error.
                let _ = live.send(Arc::new(r));
            }
        } else if ring.live.is_some() {
            ring.live = None;
        }
        while ring.kept.len() >= cap {
            ring.kept.pop_front();
        }
        if ring.kept.capacity() == 0 {
            // The whole default ring in one block at the first record, instead of ten doublings
            // copied and freed while the first records come in (a spike's, on a new proxy). A
            // larger ring configured grows as its records come.
            ring.kept.reserve_exact(cap.min(DEFAULT_CAPACITY));
        }
        ring.kept.push_back(kept);
    }

    /// Every record kept, oldest first.
    pub fn snapshot(&self) -> Vec<Record> {
        self.ring.lock().kept.iter().map(Kept::record).collect()
    }

    /// The bytes the ring holds for its records: their slots (as many as it has room for) and
    /// their strings, each shared one counted once.
    pub fn footprint(&self) -> usize {
        let ring = self.ring.lock();
        let mut shapes = std::collections::HashSet::new();
        let mut strings = std::collections::HashSet::new();
        // An `Arc`'s two reference counts.
        let counts = 2 * std::mem::size_of::<usize>();
        let mut bytes = (ring.kept.capacity() - ring.kept.len()) * std::mem::size_of::<Kept>();
        for k in &ring.kept {
            bytes += k.own_bytes();
            let shape = k.shape();
            if !shapes.insert(Arc::as_ptr(shape)) {
                continue;
            }
            bytes += counts + std::mem::size_of_val(&**shape);
            for s in shape.strings() {
                if strings.insert(Arc::as_ptr(s)) {
                    bytes += counts + s.len();
                }
            }
        }
        bytes
    }

    /// The records that ended at or after `since_ms` (milliseconds since the Unix epoch; 0 for
    /// all), oldest first, as JSON lines (what `/records` answers).
    pub fn json_lines(&self, since_ms: u64) -> String {
        let mut out = String::new();
        for r in self
            .ring
            .lock()
            .kept
            .iter()
            .filter(|r| r.at_ms() >= since_ms)
        {
            if let Ok(line) = serde_json::to_string(&r.record()) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    /// Subscribes to every record pushed from now on. With `since_ms`, also the records kept
    /// that ended at or after it, oldest first: none is in both, none pushed meanwhile is lost.
    pub fn follow(&self, since_ms: Option<u64>) -> (Vec<Record>, Follower) {
        let mut ring = self.ring.lock();
        let backlog = match since_ms {
            Some(since) => ring
                .kept
                .iter()
                .filter(|r| r.at_ms() >= since)
                .map(Kept::record)
                .collect(),
            None => Vec::new(),
        };
        let rx = ring
            .live
            .get_or_insert_with(|| broadcast::channel(FOLLOW_BUFFER).0)
            .subscribe();
        self.followers.fetch_add(1, Ordering::AcqRel);
        let follower = Follower {
            rx,
            followers: self.followers.clone(),
        };
        (backlog, follower)
    }

    /// How many followers there are now.
    pub fn followers(&self) -> usize {
        self.followers.load(Ordering::Acquire)
    }
}

// === impl Follower ===

impl Follower {
    /// The next record pushed, or how many were missed; `None` once the ring is gone.
    pub async fn next(&mut self) -> Option<Followed> {
        match self.rx.recv().await {
            Ok(r) => Some(Followed::Record(r)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Followed::Lagged(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.followers.fetch_sub(1, Ordering::AcqRel);
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
                &self.src_cluster,
                &self.dst_addr,
                &self.dst_hbone_addr,
                &self.dst_service,
                &self.dst_workload,
                &self.dst_identity,
                &self.dst_cluster,
                &self.path,
                &self.route,
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
            trace_id: format!("4bf92f3577b34da6{:016x}", i * 7919),
            at_ms: 1_796_164_665_898,
            direction: "outbound".into(),
            src_addr: format!("198.18.3.20:{}", 30_000 + i % 30_000),
            src_workload: "echo-beta-7d9f8c6b5-x2x9q".into(),
            src_identity: "spiffe://cluster.local/ns/default/sa/echo".into(),
            dst_addr: "198.18.3.50:15008".into(),
            dst_hbone_addr: "198.18.10.5:80".into(),
            dst_service: "default/audit.default.svc.cluster.local".into(),
            dst_workload: "beta//v1/Pod/default/audit-waypoint-beta-5c8d7f9b4-q7w2e".into(),
            dst_identity: "spiffe://cluster.local/ns/default/sa/audit-waypoint".into(),
            path: "hbone via waypoint default/audit-waypoint.default.svc.cluster.local".into(),
            src_cluster: "beta".into(),
            dst_cluster: "beta".into(),
            route: "service default/audit.default.svc.cluster.local:80; waypoint default/audit-waypoint.default.svc.cluster.local (of service default/audit.default.svc.cluster.local); picked beta//v1/Pod/default/audit-waypoint-beta-5c8d7f9b4-q7w2e@beta (rank 3 of 3); hbone to 198.18.3.50:15008".into(),
            decision_us: 41,
            connect_us: 1_270,
            tls_us: 1_102,
            first_byte_us: 1_980,
            verdict: "allowed",
            response_flags: "-",
            ..Record::default()
        }
    }

    /// Every string field of `typical(i)` made its own: nothing to share with another record.
    fn distinct(i: usize) -> Record {
        use std::fmt::Write;
        let mut r = typical(i);
        for s in [
            &mut r.direction,
            &mut r.src_workload,
            &mut r.src_identity,
            &mut r.src_cluster,
            &mut r.dst_addr,
            &mut r.dst_hbone_addr,
            &mut r.dst_service,
            &mut r.dst_workload,
            &mut r.dst_identity,
            &mut r.dst_cluster,
            &mut r.path,
            &mut r.route,
            &mut r.policy,
            &mut r.rule,
            &mut r.error,
        ] {
            let _ = write!(s, "-{i}");
        }
        r
    }

    /// A spike's records (one source to one service: the same but for the id, trace id and
    /// source address): the ring keeps what they share once. Before it did, a full ring of
    /// them held 1.26 MB (the records' own footprint, as the second bound measures); with each
    /// string kept once but 15 of them per record, 420 KiB.
    #[test]
    fn a_full_ring_of_a_spikes_records_holds_under_192_kib() {
        let r = Records::new(DEFAULT_CAPACITY);
        for i in 0..DEFAULT_CAPACITY * 2 {
            r.push(typical(i));
        }
        let kept = r.snapshot();
        assert_eq!(kept.len(), DEFAULT_CAPACITY);
        let bytes = r.footprint();
        let unshared: usize = kept.iter().map(Record::footprint).sum();
        eprintln!("{bytes} bytes for {DEFAULT_CAPACITY} typical records ({unshared} unshared)");
        assert!(bytes < 192 * 1024, "{bytes} bytes");
        assert!(
            unshared > 1024 * 1024,
            "the same records unshared: {unshared} bytes"
        );

        // From IPv6 sources, the own strings go to the heap.
        let r = Records::new(DEFAULT_CAPACITY);
        for i in 0..DEFAULT_CAPACITY * 2 {
            let mut rec = typical(i);
            rec.src_addr = format!("[fd00:198:18:3::20:{:x}]:{}", i, 30_000 + i % 30_000);
            r.push(rec);
        }
        let bytes = r.footprint();
        eprintln!("{bytes} bytes for {DEFAULT_CAPACITY} typical records from IPv6 sources");
        assert!(bytes < 256 * 1024, "{bytes} bytes");
    }

    /// Records that share nothing still keep under the documented bound: 1.5 MiB.
    #[test]
    fn a_full_ring_of_records_that_share_nothing_stays_under_its_stated_bound() {
        let r = Records::new(DEFAULT_CAPACITY);
        for i in 0..DEFAULT_CAPACITY * 2 {
            r.push(distinct(i));
        }
        let bytes = r.footprint();
        eprintln!("{bytes} bytes for {DEFAULT_CAPACITY} records that share nothing");
        assert!(bytes < 1536 * 1024, "{bytes} bytes");
        assert!(
            bytes > 512 * 1024,
            "the measure counts the strings too: {bytes}"
        );
    }

    /// What is read back (records, JSON lines, a follower's backlog) is what was pushed,
    /// field for field, whether it shared its strings or not.
    #[test]
    fn records_read_back_are_the_records_pushed() {
        let r = Records::new(16);
        let mut pushed = Vec::new();
        for i in 0..12 {
            let mut rec = if i % 3 == 0 { distinct(i) } else { typical(i) };
            rec.at_ms += i as u64;
            rec.bytes_sent = i as u64 * 3;
            rec.error = if i % 2 == 0 {
                String::new()
            } else {
                "reset".into()
            };
            pushed.push(rec.clone());
            r.push(rec);
        }
        r.push(Record::default());
        pushed.push(Record::default());
        assert_eq!(r.snapshot(), pushed);
        let lines: Vec<String> = pushed
            .iter()
            .filter(|p| p.at_ms >= 1_796_164_665_900)
            .map(|p| serde_json::to_string(p).expect("json") + "\n")
            .collect();
        assert_eq!(r.json_lines(1_796_164_665_900), lines.concat());
        let (backlog, _follower) = r.follow(Some(0));
        assert_eq!(backlog, pushed);
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
        assert_eq!(r.json_lines(0).lines().count(), 3);
        r.capacity.store(0, Ordering::Relaxed);
        r.push(Record::default());
        assert_eq!(r.snapshot().len(), 3, "a ring of 0 keeps nothing new");
        assert_ne!(r.next_id(), r.next_id());
    }
}

#[cfg(test)]
mod follow_tests;
