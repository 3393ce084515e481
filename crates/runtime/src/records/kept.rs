//! A [`Record`] as the ring keeps it: in a spike's records most fields are the same from one
//! record to the next (the source, the destination, the path and the route, the verdict), so
//! they are kept once, as one shared [`Shape`], each of its strings shared with other shapes
//! too; the three that differ per connection (the id, the trace id, the source address) share
//! one allocation. A full ring of a spike's records went from about 1.2 MiB in 19 allocations
//! per record to 420 KiB in about one, then to about 160 KiB with the shape (a record's slot
//! 360 -> 96 bytes; issue 21: the ring is most of what a node proxy holds above idle 60 s after
//! a 5,000-connection spike).

use std::sync::Arc;

use super::Record;

/// Fields kept shared, in this order.
const SHARED: usize = 15;

/// Recent distinct values kept per shared field, and recent shapes: a later record with one of
/// them shares it.
const RECENT: usize = 8;

/// What a record shares with the records like it.
#[derive(Debug)]
pub(super) struct Shape {
    strings: [Arc<str>; SHARED],
    verdict: &'static str,
    response_flags: &'static str,
}

impl Shape {
    /// Whether this is the shape of `strings` (each field already shared through the
    /// interner, so one equal to a recent value is that value) and the two flags.
    fn is(&self, strings: &[Arc<str>; SHARED], verdict: &str, response_flags: &str) -> bool {
        self.verdict == verdict
            && self.response_flags == response_flags
            && self
                .strings
                .iter()
                .zip(strings)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Its strings, each to be counted once however many shapes share it.
    pub(super) fn strings(&self) -> &[Arc<str>] {
        &self.strings
    }
}

/// One record in the ring.
#[derive(Debug)]
pub(super) struct Kept {
    /// `id`, `trace_id` and `src_addr`, one after the other.
    own: Box<str>,
    /// Where `trace_id` and `src_addr` start in `own`.
    cuts: [u32; 2],
    shape: Arc<Shape>,
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

/// The recent values of each shared field and the recent shapes, most recently used first.
#[derive(Debug, Default)]
pub(super) struct Interner {
    recent: [Vec<Arc<str>>; SHARED],
    shapes: Vec<Arc<Shape>>,
}

/// `value` from `recent` if equal to one there (then most recent), else `new(value)`, kept as
/// the most recent one of at most [`RECENT`].
fn share<T: ?Sized>(
    recent: &mut Vec<Arc<T>>,
    is: impl Fn(&T) -> bool,
    new: impl FnOnce() -> Arc<T>,
) -> Arc<T> {
    if let Some(at) = recent.iter().position(|v| is(v)) {
        recent[..=at].rotate_right(1);
        return recent[0].clone();
    }
    let new = new();
    if recent.len() == RECENT {
        recent.pop();
    }
    recent.insert(0, new.clone());
    new
}

impl Interner {
    /// The shape of `r`: a recent one's if the same, else a new one (then recent).
    fn shape(&mut self, r: &Record) -> Arc<Shape> {
        let fields = shared_fields(r);
        let strings: [Arc<str>; SHARED] = std::array::from_fn(|i| {
            share(
                &mut self.recent[i],
                |v| *v == *fields[i],
                || Arc::from(fields[i]),
            )
        });
        share(
            &mut self.shapes,
            |s| s.is(&strings, r.verdict, r.response_flags),
            || {
                Arc::new(Shape {
                    strings: strings.clone(),
                    verdict: r.verdict,
                    response_flags: r.response_flags,
                })
            },
        )
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
        Self {
            own,
            cuts,
            shape: interner.shape(r),
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
        ] = self.shape.strings.each_ref().map(|s| s.to_string());
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
            verdict: self.shape.verdict,
            policy,
            rule,
            response_flags: self.shape.response_flags,
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

    /// Its shape, to be counted once however many records share it.
    pub(super) fn shape(&self) -> &Arc<Shape> {
        &self.shape
    }
}
