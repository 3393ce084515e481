//! A [`Record`] as the ring keeps it: in a spike's records most fields are the same from one
//! record to the next (the source, the destination, the path and the route), so each such
//! string is kept once and shared; the three that differ per connection (the id, the trace id,
//! the source address) share one allocation. A full ring of a spike's records went from about
//! 1.2 MiB in 19 allocations per record to under 0.5 MiB in about one (issue 21:
//! the ring was half of what a node proxy kept 60 s after a 5,000-connection spike).

use std::sync::Arc;

use super::Record;

/// Fields kept shared, in this order.
const SHARED: usize = 15;

/// Recent distinct values kept per shared field: a later record with one of them shares it.
const RECENT: usize = 8;

/// One record in the ring.
#[derive(Debug)]
pub(super) struct Kept {
    /// `id`, `trace_id` and `src_addr`, one after the other.
    own: Box<str>,
    /// Where `trace_id` and `src_addr` start in `own`.
    cuts: [u32; 2],
    shared: [Arc<str>; SHARED],
    verdict: &'static str,
    response_flags: &'static str,
    at_ms: u64,
    bytes_sent: u64,
    bytes_recv: u64,
    duration_ms: u64,
    decision_us: u64,
    connect_us: u64,
    tls_us: u64,
    first_byte_us: u64,
}

/// The shared fields of `r`, in [`Kept::shared`]'s order.
fn shared_fields(r: &Record) -> [&str; SHARED] {
    [
        &r.direction,
        &r.src_workload,
        &r.src_identity,
        &r.src_cluster,
        &r.dst_addr,
        &r.dst_hbone_addr,
        &r.dst_service,
        &r.dst_workload,
        &r.dst_identity,
        &r.dst_cluster,
        &r.path,
        &r.route,
        &r.policy,
        &r.rule,
        &r.error,
    ]
}

/// The recent values of each shared field, most recently used first.
#[derive(Debug, Default)]
pub(super) struct Interner {
    recent: [Vec<Arc<str>>; SHARED],
}

impl Interner {
    /// `value` of field `field`: a recent one's if equal, else a new one (then recent).
    fn share(&mut self, field: usize, value: &str) -> Arc<str> {
        let recent = &mut self.recent[field];
        if let Some(at) = recent.iter().position(|v| **v == *value) {
            recent[..=at].rotate_right(1);
            return recent[0].clone();
        }
        let new: Arc<str> = Arc::from(value);
        if recent.len() == RECENT {
            recent.pop();
        }
        recent.insert(0, new.clone());
        new
    }
}

impl Kept {
    /// `r` as kept, its shared fields through `interner`. A field longer than 4 GiB cannot be
    /// in a record (it came from an access-log line); such a record is kept without its own
    /// strings rather than panicking.
    pub(super) fn new(r: &Record, interner: &mut Interner) -> Self {
        let cut = |n: usize| u32::try_from(n).ok();
        let (own, cuts) = match (
            cut(r.id.len()),
            cut(r.id.len() + r.trace_id.len()),
            cut(r.id.len() + r.trace_id.len() + r.src_addr.len()),
        ) {
            (Some(a), Some(b), Some(_)) => {
                let mut own =
                    String::with_capacity(r.id.len() + r.trace_id.len() + r.src_addr.len());
                own.push_str(&r.id);
                own.push_str(&r.trace_id);
                own.push_str(&r.src_addr);
                (own.into_boxed_str(), [a, b])
            }
            _ => (Box::default(), [0, 0]),
        };
        let fields = shared_fields(r);
        Self {
            own,
            cuts,
            shared: std::array::from_fn(|i| interner.share(i, fields[i])),
            verdict: r.verdict,
            response_flags: r.response_flags,
            at_ms: r.at_ms,
            bytes_sent: r.bytes_sent,
            bytes_recv: r.bytes_recv,
            duration_ms: r.duration_ms,
            decision_us: r.decision_us,
            connect_us: r.connect_us,
            tls_us: r.tls_us,
            first_byte_us: r.first_byte_us,
        }
    }

    pub(super) fn at_ms(&self) -> u64 {
        self.at_ms
    }

    /// The record it keeps.
    pub(super) fn record(&self) -> Record {
        let [a, b] = self.cuts.map(|c| c as usize);
        let own = |from: usize, to: usize| self.own.get(from..to).unwrap_or("").to_string();
        let [
            direction,
            src_workload,
            src_identity,
            src_cluster,
            dst_addr,
            dst_hbone_addr,
            dst_service,
            dst_workload,
            dst_identity,
            dst_cluster,
            path,
            route,
            policy,
            rule,
            error,
        ] = self.shared.each_ref().map(|s| s.to_string());
        Record {
            id: own(0, a),
            trace_id: own(a, b),
            src_addr: own(b, self.own.len()),
            at_ms: self.at_ms,
            direction,
            src_workload,
            src_identity,
            src_cluster,
            dst_addr,
            dst_hbone_addr,
            dst_service,
            dst_workload,
            dst_identity,
            dst_cluster,
            path,
            route,
            verdict: self.verdict,
            policy,
            rule,
            response_flags: self.response_flags,
            error,
            bytes_sent: self.bytes_sent,
            bytes_recv: self.bytes_recv,
            duration_ms: self.duration_ms,
            decision_us: self.decision_us,
            connect_us: self.connect_us,
            tls_us: self.tls_us,
            first_byte_us: self.first_byte_us,
        }
    }

    /// The bytes only this record holds: itself (its slot in the ring) and its own strings.
    pub(super) fn own_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.own.len()
    }

    /// Its shared strings, to be counted once however many records share them.
    pub(super) fn shared(&self) -> &[Arc<str>] {
        &self.shared
    }
}
