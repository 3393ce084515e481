//! Giving memory back after a load spike. With glibc's allocator (the binary now runs on
//! jemalloc, whose unused pages [`trim`] purges as well), memory freed when thousands of
//! connections close stays in the process (measured: RSS 6x the idle footprint after 5,000
//! connections had come and gone). Whenever the number of open connections, or of HBONE
//! connections, has fallen to half of its peak since the last trim, `malloc_trim` hands the free
//! pages back to the system (measured: 1.3x the idle footprint after the same spike).
//!
//! jemalloc also keeps freed blocks in each thread's cache (up to 20 of each size to 32 KiB:
//! measured, about 4 MB of a node proxy's 6 MB left 60 s after a 5,000-connection spike), which
//! only that thread can flush and which a purge does not touch: each trim asks every runtime
//! worker to flush its own when it next parks ([`on_worker_park`]), and wakes the ones asleep
//! so that they do ([`wake_workers`]).
//!
//! Event-driven: the [`crate::state::Open`] guard that takes the count of open connections to
//! half its peak wakes [`give_back`] ([`crate::state::Node::halved`]), which trims once the
//! drop has settled ([`settle`]). The HBONE connections that carried them close later: each of
//! their closes wakes [`follow_tunnels`] after a burst, until they stop closing.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_hbone::pool::PoolConfig;

use crate::state::{Node, halved};

mod code;
mod idle;

/// Below this peak of HBONE connections, a drop is not worth a walk over the heap.
const HBONE_FLOOR: u64 = 4;

/// Whether `hbone` connections, down from `peak`, are a drop worth trimming after.
fn hbone_halved(hbone: u64, peak: u64) -> bool {
    peak >= HBONE_FLOOR && hbone * 2 <= peak
}

/// Runs forever; trims after each large drop in open connections, then follows the HBONE
/// connections left over from the burst until they stop closing.
pub(crate) async fn give_back(node: Arc<Node>) {
    loop {
        node.halved.notified().await;
        // Read now: near its peak, as the connections it carried have just closed.
        let hbone_peak = hbone(&node);
        settle(&node).await;
        let open = node.active.load(Ordering::Relaxed);
        let peak = node.peak_active.load(Ordering::Relaxed);
        if halved(open, peak) {
            let released = trim();
            tracing::debug!(open, peak, released, "gave freed memory back to the system");
            node.peak_active.store(open, Ordering::Relaxed);
        }
        follow_tunnels(&node, hbone_peak).await;
    }
}

/// HBONE connections being served or pooled.
fn hbone(node: &Node) -> u64 {
    node.pool.connections() as u64 + node.hbone_conns.count()
}

/// After a burst: the HBONE connections that carried it close later (the pool lets its surplus
/// go after `surplus_idle_timeout`, peers likewise). Each close of a served or pooled HBONE
/// connection wakes this; memory is given back each time their count has halved, until none
/// has closed for that timeout and a little more. Nothing runs between bursts.
async fn follow_tunnels(node: &Node, mut peak: u64) {
    // The pool lets its surplus go at their idle timeout (each connection's own deadline).
    let patience = PoolConfig::default().surplus_idle_timeout + Duration::from_secs(2);
    loop {
        // Registered before the count is read, so that a close in between is not missed.
        let pooled = node.pool.closed();
        let served = node.hbone_conns.closed();
        tokio::pin!(pooled, served);
        pooled.as_mut().enable();
        served.as_mut().enable();
        let now = hbone(node);
        if hbone_halved(now, peak) {
            let released = trim();
            tracing::debug!(
                hbone = now,
                hbone_peak = peak,
                released,
                "gave freed memory back to the system"
            );
            peak = now;
        }
        if now == 0 {
            return;
        }
        tokio::select! {
            () = pooled => {}
            () = served => {}
            () = tokio::time::sleep(patience) => return,
        }
        // A pooled connection let go still closes (GOAWAY, close_notify) before its buffers
        // are freed: counted and trimmed once that has had a moment.
        tokio::time::sleep(SETTLE).await;
    }
}

/// A burst's connections close over a moment: trimming once they have (no drop below half for
/// [`SETTLE`]) gives all of it back, where trimming at the first halving gave back half. Waits
/// at most [`SETTLE_MAX`], so that steady traffic below the old peak does not put it off.
async fn settle(node: &Node) {
    let most = tokio::time::sleep(SETTLE_MAX);
    tokio::pin!(most);
    loop {
        tokio::select! {
            () = node.halved.notified() => {}
            () = tokio::time::sleep(SETTLE) => return,
            () = &mut most => return,
        }
    }
}

/// How long the open connections must stop falling before a trim.
const SETTLE: Duration = Duration::from_millis(500);
/// The longest a trim waits for them to.
const SETTLE_MAX: Duration = Duration::from_secs(5);

/// Returns free heap pages to the system: jemalloc's (the `ferry` binary's allocator, which
/// would otherwise give them back only as allocations tick its decay) and glibc's (what C code
/// still allocates there). `true` if either released any (jemalloc's purge: if it ran).
pub(crate) fn trim() -> bool {
    TRIMS.fetch_add(1, Ordering::Relaxed);
    wake_workers();
    flush_thread_cache();
    let jemalloc = purge_jemalloc();
    let glibc = trim_glibc();
    // The code the spike ran leaves the resident set too; what runs next maps its own back.
    code::release();
    jemalloc || glibc
}

/// Start-up is over (the node agent's first replay served, or the state file's pods): the
/// binary's pages that only it ran leave the resident set ([`code`]).
pub(crate) fn started() {
    let released = code::release();
    tracing::debug!(released, "the code pages start-up ran were released");
}

/// Runs forever: trims once the process has turned quiet after it mapped pages back in (the
/// rest of start-up, a load that ended without a spike, anything an idle proxy does not run
/// again), then again only after more came back ([`idle`]). One `getrusage` per [`idle::CHECK`].
pub(crate) async fn release_when_idle() {
    let Some(start) = idle::Usage::now() else {
        return;
    };
    let mut idle = idle::Idle::new(start);
    let mut tick = tokio::time::interval(idle::CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(now) = idle::Usage::now() else {
            return;
        };
        if idle.check(now) {
            let released = trim();
            tracing::debug!(
                released,
                faults = now.faults,
                "the node proxy turned quiet: gave memory back"
            );
            idle.released(idle::Usage::now().unwrap_or(now));
        }
    }
}

/// How many trims there were: a thread whose cache was last flushed at a smaller count
/// flushes it when it next parks.
static TRIMS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// [`TRIMS`] when this thread last flushed its cache.
    static FLUSHED_AT: Cell<u64> = const { Cell::new(0) };
}

/// Flushes by workers as they follow a trim (each wakes [`FOLLOWED`]).
static FLUSHES: AtomicU64 = AtomicU64::new(0);

/// Woken at each worker's flush after a trim; waited on with [`FOLLOWED_LOCK`] held (a
/// condition variable is used with one mutex).
static FOLLOWED: parking_lot::Condvar = parking_lot::Condvar::new();
static FOLLOWED_LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// How long [`wake_workers`] waits for a worker's flush before it wakes one again.
const WAKE_AGAIN: Duration = Duration::from_millis(5);

/// How many times [`wake_workers`] wakes a worker at most (about a second in all).
const WAKES: usize = 200;

/// After a trim (called on a runtime worker): wakes the runtime's parked workers, so that
/// each follows it as it parks again. A worker asleep at the trim flushed only when work next
/// came, which for an idle node proxy may be minutes: 60 s after a 5,000-connection spike the
/// caches of the workers that had slept through the last trim held 88-476 KiB (measured by
/// flushing them through gdb; issue 21). A task spawned from outside the runtime wakes a
/// parked worker: a thread of its own spawns one no-op task at a time until as many flushes
/// as the runtime has workers have followed (the one running the trim flushes as it parks
/// too), each waited for at most [`WAKE_AGAIN`]. Nothing happens outside a runtime.
fn wake_workers() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let workers = runtime.metrics().num_workers() as u64;
    let start = FLUSHES.load(Ordering::SeqCst);
    let waker = std::thread::Builder::new()
        .name("ferry-trim".into())
        .spawn(move || {
            let mut held = FOLLOWED_LOCK.lock();
            for _ in 0..WAKES {
                if FLUSHES.load(Ordering::SeqCst) - start >= workers {
                    return;
                }
                drop(runtime.spawn(async {}));
                FOLLOWED.wait_for(&mut held, WAKE_AGAIN);
            }
        });
    if let Err(error) = waker {
        tracing::debug!(%error, "no thread to wake the workers after a trim");
    }
}

/// For the runtime's `on_thread_park`: a worker going idle after a trim it has not followed
/// yet flushes its jemalloc thread cache (the blocks it holds go back to their arena) and
/// purges: the pages the flush emptied are returned now. jemalloc's decay would return them
/// only as allocations tick it, which a quiet process does not do. One atomic load otherwise.
pub fn on_worker_park() {
    let trims = TRIMS.load(Ordering::Relaxed);
    FLUSHED_AT.with(|at| {
        if at.get() != trims {
            at.set(trims);
            release_thread_cache();
            FLUSHES.fetch_add(1, Ordering::SeqCst);
            FOLLOWED.notify_all();
        }
    });
}

/// The calling thread's jemalloc cache back to its arena, and the pages that emptied back to
/// the system. For a thread the trims do not reach otherwise: the process's main thread, once
/// its setup is done (it then only waits for the signal to stop; the runtime does not park it
/// through `on_thread_park`).
pub(crate) fn release_thread_cache() {
    flush_thread_cache();
    purge_jemalloc();
}

/// `thread.tcache.flush`: the calling thread's cached free blocks go back to their arena.
#[allow(unsafe_code)]
fn flush_thread_cache() -> bool {
    const FLUSH: &[u8] = b"thread.tcache.flush\0";
    // SAFETY: the name is NUL-terminated; this control reads and writes nothing (null old and
    // new values) and acts on the calling thread's own cache only.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            FLUSH.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        ) == 0
    }
}

/// `arena.<MALLCTL_ARENAS_ALL>.purge`: every jemalloc arena returns its unused dirty pages.
#[allow(unsafe_code)]
fn purge_jemalloc() -> bool {
    const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
    // SAFETY: the name is NUL-terminated; this control reads and writes nothing (null old and
    // new values, as jemalloc requires for it) and is safe to call from any thread.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        ) == 0
    }
}

fn trim_glibc() -> bool {
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

    /// The control's name and calling convention are right: jemalloc runs it (a wrong name is
    /// ENOENT, a value passed to it EPERM).
    #[test]
    fn jemalloc_purges_its_arenas() {
        assert!(purge_jemalloc());
    }

    /// The same for the thread cache's flush.
    #[test]
    fn jemalloc_flushes_the_thread_cache() {
        assert!(flush_thread_cache());
    }

    /// The tests that trim and count the workers' flushes, one at a time (the counts are the
    /// process's).
    static TRIMMING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    /// Each worker's [`FLUSHED_AT`] as it last parked.
    type Parked = Arc<parking_lot::Mutex<std::collections::HashMap<std::thread::ThreadId, u64>>>;

    /// A 2-worker runtime whose workers follow the trims as they park, recording that in the
    /// map returned, once both have started and parked. The second wakes only when tokio
    /// hands it a search for work, which on a loaded machine took over 10 s once: `deadline`
    /// is generous.
    fn parked_runtime(deadline: std::time::Instant) -> (tokio::runtime::Runtime, Parked) {
        let parked = Parked::default();
        let seen = parked.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .on_thread_park(move || {
                on_worker_park();
                let at = FLUSHED_AT.with(Cell::get);
                seen.lock().insert(std::thread::current().id(), at);
            })
            .build()
            .expect("a runtime");
        while parked.lock().len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the workers never parked"
            );
            std::thread::yield_now();
        }
        (rt, parked)
    }

    /// After a trim handed in from outside the runtime, every worker has flushed its cache,
    /// the one that had been asleep since it started included.
    #[test]
    fn every_worker_flushes_after_a_trim() {
        let _one = TRIMMING.lock();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (rt, parked) = parked_runtime(deadline);
        let trims = rt
            .block_on(async {
                tokio::spawn(async {
                    trim();
                    TRIMS.load(Ordering::Relaxed)
                })
                .await
            })
            .expect("the trim");
        // A worker flushes as it next parks; no-op tasks from outside the runtime, each of
        // which wakes a parked worker, as a node proxy's timers and connections would.
        while parked.lock().values().any(|at| *at < trims) {
            assert!(
                std::time::Instant::now() < deadline,
                "a worker did not flush after the trim: {:?}",
                parked.lock()
            );
            drop(rt.spawn(async {}));
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A trim wakes the workers asleep at it: each flushes with no other work coming (without
    /// the wake, the one asleep flushed only when a task next came, which on an idle node proxy
    /// may be minutes).
    #[test]
    fn a_trim_wakes_the_sleeping_workers_to_flush() {
        let _one = TRIMMING.lock();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (rt, parked) = parked_runtime(deadline);
        // As in a node proxy, the trim runs when a timer fires on the worker that waits on
        // the driver, the other asleep (parked again long before, as a rule).
        let trimmed = rt.spawn(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            trim();
            TRIMS.load(Ordering::Relaxed)
        });
        let trims = rt.block_on(trimmed).expect("the trim");
        // No task from here on: only the trim's own wake-ups.
        let mut flushed = FLUSHES.load(Ordering::SeqCst);
        while parked.lock().values().any(|at| *at < trims) {
            assert!(
                std::time::Instant::now() < deadline,
                "a worker did not flush after the trim: {:?}",
                parked.lock()
            );
            // Woken at each flush (and checked again every 100 ms at most).
            let mut held = FOLLOWED_LOCK.lock();
            if FLUSHES.load(Ordering::SeqCst) == flushed {
                FOLLOWED.wait_for(&mut held, Duration::from_millis(100));
            }
            flushed = FLUSHES.load(Ordering::SeqCst);
        }
    }

    /// A worker flushes once per trim it has not followed, on its own thread.
    #[test]
    fn a_parking_worker_follows_each_trim_once() {
        let _one = TRIMMING.lock();
        std::thread::spawn(|| {
            let before = TRIMS.load(Ordering::Relaxed);
            on_worker_park();
            let seen = FLUSHED_AT.with(Cell::get);
            assert!(seen >= before, "followed the trims before it");
            TRIMS.fetch_add(1, Ordering::Relaxed);
            on_worker_park();
            assert!(FLUSHED_AT.with(Cell::get) > seen, "followed the new trim");
        })
        .join()
        .expect("the worker thread");
    }

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
