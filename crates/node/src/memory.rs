//! Giving memory back after a load spike. With glibc's allocator, memory freed when thousands of
//! connections close stays in the process (measured: RSS 6x the idle footprint after 5,000
//! connections had come and gone). Whenever the number of open connections, or of HBONE
//! connections, has fallen to half of its peak since the last trim, `malloc_trim` hands the free
//! pages back to the system (measured: 1.3x the idle footprint after the same spike).
//!
//! Event-driven: the last [`crate::node::Open`] guard that takes the count of open connections
//! to half its peak wakes [`give_back`] ([`crate::node::Node::halved`]). The HBONE connections
//! that carried them close later (the pool lets a burst's surplus go after its
//! `surplus_idle_timeout`), so one more look follows that long after each wake-up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ferry_hbone::pool::PoolConfig;

use crate::node::Node;

/// Below this peak of open connections, a drop is not worth a walk over the heap.
const CONNS_FLOOR: u64 = 64;
/// Below this peak of HBONE connections, likewise.
const HBONE_FLOOR: u64 = 4;

/// Whether `open` connections, down from `peak`, are a drop worth trimming after; what
/// [`crate::node::Open`]'s drop asks before waking [`give_back`].
pub(crate) fn halved(open: u64, peak: u64) -> bool {
    peak >= CONNS_FLOOR && open * 2 <= peak
}

/// Whether `hbone` connections, down from `peak`, are a drop worth trimming after.
fn hbone_halved(hbone: u64, peak: u64) -> bool {
    peak >= HBONE_FLOOR && hbone * 2 <= peak
}

/// Runs forever; trims after each large drop in open connections, and looks again once the
/// HBONE connections left over from the burst have had time to close.
pub(crate) async fn give_back(node: Arc<Node>) {
    let later = PoolConfig::default().surplus_idle_timeout + Duration::from_secs(2);
    let mut hbone_peak = 0;
    let mut look_again: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let tunnels_closed = async {
            match look_again.as_mut() {
                Some(at) => at.await,
                None => std::future::pending().await,
            }
        };
        // The HBONE count is read at each wake-up: near its peak when the connections it
        // carried have just closed, down once its surplus went.
        let hbone = || node.pool.connections() as u64 + node.hbone_conns.load(Ordering::Relaxed);
        tokio::select! {
            () = node.halved.notified() => {
                hbone_peak = hbone_peak.max(hbone());
                look_again = Some(Box::pin(tokio::time::sleep(later)));
            }
            () = tunnels_closed => look_again = None,
        }
        let open = node.active.load(Ordering::Relaxed);
        let peak = node.peak_active.load(Ordering::Relaxed);
        let hbone = hbone();
        hbone_peak = hbone_peak.max(hbone);
        if halved(open, peak) || hbone_halved(hbone, hbone_peak) {
            let released = trim();
            tracing::debug!(
                open,
                peak,
                hbone,
                hbone_peak,
                released,
                "gave freed memory back to the system"
            );
            node.peak_active.store(open, Ordering::Relaxed);
            hbone_peak = hbone;
        }
    }
}

/// Returns free heap pages to the system; `true` if any were released.
pub(crate) fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers
        // from us and is safe to call from any thread at any time.
        unsafe { nix::libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_follows_a_fall_to_half_of_a_peak_worth_it() {
        assert!(halved(32, 64));
        assert!(halved(0, 5_000));
        assert!(!halved(33, 64), "not yet half");
        assert!(!halved(0, 63), "too small a peak");
        assert!(hbone_halved(2, 4));
        assert!(!hbone_halved(3, 4));
        assert!(!hbone_halved(0, 3));
    }
}
