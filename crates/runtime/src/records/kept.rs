//! A [`Record`] as the ring keeps it: in a spike's records most fields are the same from one
//! record to the next (the source, the destination, the path and the route, the verdict), so
//! they are kept once, as one shared [`Shape`], each of its strings shared with other shapes
//! too; the three that differ per connection (the id, the trace id, the source address) share
//! one allocation. A full ring of a spike's records went from about 1.2 MiB in 19 allocations
//! per record to 420 KiB in about one, then to about 160 KiB with the shape (a record's slot
//! 360 -> 96 bytes; issue 21: the ring is most of what a node proxy holds above idle 60 s after
//! a 5,000-connection spike). The three own strings are kept in the slot itself when they fit
//! ([`Own`]), as they do for an IPv4 source: a record then allocates nothing of its own, so the
//! last 1,024 records of a spike pin no small-block pages among the spike's freed ones.

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

/// Bytes of own strings a slot holds without an allocation: an id (`<pid in hex>-<sequence>`,
/// up to 17 below ten billion connections), a W3C trace id (32) and an IPv4 source address with
/// its port (up to 21) fit; the slot is then 152 bytes.
const INLINE: usize = 70;

/// A record's own strings, one after the other: in its slot when they fit, else on the heap.
#[derive(Debug)]
enum Own {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl Own {
    fn new(parts: [&str; 3]) -> Self {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len <= INLINE {
            let mut bytes = [0; INLINE];
            let mut at = 0;
            for p in parts {
                bytes[at..at + p.len()].copy_from_slice(p.as_bytes());
                at += p.len();
            }
            return Self::Inline {
                len: len as u8,
                bytes,
            };
        }
        let mut own = String::with_capacity(len);
        for p in parts {
            own.push_str(p);
        }
        Self::Heap(own.into_boxed_str())
    }

    fn as_str(&self) -> &str {
        match self {
            // Three whole strings copied in: valid UTF-8.
            Self::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or("")
            }
            Self::Heap(s) => s,
        }
    }

    /// What it holds outside the slot.
    fn heap_bytes(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            Self::Heap(s) => s.len(),
        }
    }
}

/// One record in the ring.
#[derive(Debug)]
pub(super) struct Kept {
    /// `id`, `trace_id` and `src_addr`, one after the other.
    own: Own,
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
            (Some(a), Some(b), Some(_)) => (Own::new([&r.id, &r.trace_id, &r.src_addr]), [a, b]),
            _ => (Own::new([""; 3]), [0, 0]),
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
        let all = self.own.as_str();
        let own = |from: usize, to: usize| all.get(from..to).unwrap_or("").to_string();
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
            src_addr: own(b, all.len()),
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

    /// The bytes only this record holds: itself (its slot in the ring) and its own strings
    /// that did not fit in it.
    pub(super) fn own_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.own.heap_bytes()
    }

    /// Its shape, to be counted once however many records share it.
    pub(super) fn shape(&self) -> &Arc<Shape> {
        &self.shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_strings_that_fit_stay_in_the_slot_and_longer_ones_read_back_whole() {
        let mut interner = Interner::default();
        let v4 = Record {
            id: "3fffff-9999999999".into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            src_addr: "198.180.255.255:65535".into(),
            ..Record::default()
        };
        let k = Kept::new(&v4, &mut interner);
        assert!(matches!(k.own, Own::Inline { .. }), "{:?}", k.own);
        assert_eq!(k.own_bytes(), std::mem::size_of::<Kept>());
        assert!(
            std::mem::size_of::<Kept>() <= 152,
            "{}",
            std::mem::size_of::<Kept>()
        );
        let back = k.record();
        assert_eq!(
            (back.id, back.trace_id, back.src_addr),
            (v4.id.clone(), v4.trace_id.clone(), v4.src_addr.clone())
        );

        let v6 = Record {
            src_addr: "[fd00:ab:cd:ef:1234:5678:9abc:def0]:54321".into(),
            ..v4.clone()
        };
        let k = Kept::new(&v6, &mut interner);
        assert!(matches!(k.own, Own::Heap(_)));
        assert_eq!(
            k.own_bytes(),
            std::mem::size_of::<Kept>() + v6.id.len() + v6.trace_id.len() + v6.src_addr.len()
        );
        let back = k.record();
        assert_eq!(
            (back.id, back.trace_id, back.src_addr),
            (v6.id, v6.trace_id, v6.src_addr)
        );

        let empty = Kept::new(&Record::default(), &mut interner).record();
        assert_eq!((empty.id, empty.src_addr), (String::new(), String::new()));
    }
}
