//! Helpers for tests, benchmarks and examples (feature `testing`): a generated topology file
//! of any size.

use std::fmt::Write as _;

pub mod control;
pub mod sim;

/// A topology file of `workloads` pods and `services` services over two clusters on two
/// networks and 100 nodes: service `svcK` selects the pods labelled `app: svcK` (pod `i` is
/// labelled `svc(i % services)`), every even service is global, a namespace policy allows the
/// namespace's own identities and every tenth service has a selector policy of its own.
/// `edit` changes pod0's capacity to `edit + 1`: two files with different `edit`s differ in one
/// workload, as a one-workload edit does.
pub fn generated_topology(workloads: usize, services: usize, edit: u32) -> String {
    let services = services.max(1);
    let mut t = String::with_capacity(workloads * 160 + services * 220 + 4096);
    t.push_str("trust_domain: cluster.local\nclusters:\n");
    t.push_str("  - {name: east, network: net-east}\n  - {name: west, network: net-west}\n");
    t.push_str("nodes:\n");
    for n in 0..100 {
        let cluster = if n % 2 == 0 { "east" } else { "west" };
        let _ = writeln!(
            t,
            "  - {{name: node{n}, cluster: {cluster}, locality: {{region: r{}, zone: z{}}}}}",
            n % 2,
            n % 4
        );
    }
    t.push_str("services:\n");
    for s in 0..services {
        let net = if s % 2 == 0 { "net-east" } else { "net-west" };
        let scope = if s % 2 == 0 { "global" } else { "local" };
        let _ = writeln!(
            t,
            "  - {{name: svc{s}, vips: [{{network: {net}, address: 10.{}.{}.{}}}], ports: [{{port: 80, target_port: 8080}}], selector: {{app: svc{s}}}, scope: {scope}}}",
            200 + s / 62_500,
            s / 250 % 250,
            s % 250 + 1
        );
    }
    t.push_str("workloads:\n");
    for i in 0..workloads {
        // Pods alternate clusters with their nodes; addresses unique per network.
        let n = i % 100;
        let j = i / 2;
        let capacity = if i == 0 { edit + 1 } else { 1 };
        let _ = writeln!(
            t,
            "  - {{name: pod{i}, service_account: sa{}, node: node{n}, address: 10.{}.{}.{}, capacity: {capacity}, labels: {{app: svc{}}}}}",
            i % services,
            j / 62_500,
            j / 250 % 250,
            j % 250 + 1,
            i % services
        );
    }
    t.push_str("policies:\n");
    t.push_str("  - {name: allow-default, namespace: default, action: allow, rules: [{from: [{namespaces: [default]}]}]}\n");
    for s in (0..services).step_by(10) {
        let _ = writeln!(
            t,
            "  - {{name: deny-svc{s}-debug, namespace: default, selector: {{app: svc{s}}}, action: deny, rules: [{{to: [{{ports: [9000]}}]}}]}}"
        );
    }
    t
}

/// What `ferry control serve` runs with for a topology file on loopback: ports picked by the
/// kernel, TLS, a fast debounce, and room for many node proxies from 127.0.0.1.
pub fn local_config(topology: &std::path::Path, state_dir: &std::path::Path) -> crate::app::Config {
    use std::time::Duration;
    crate::app::Config {
        source: crate::app::Source::File(topology.to_path_buf()),
        state_dir: state_dir.to_path_buf(),
        listen: ([127, 0, 0, 1], 0).into(),
        ca: None,
        extra_roots: None,
        max_lifetime: Duration::from_secs(3600),
        metrics_listen: ([127, 0, 0, 1], 0).into(),
        plaintext: false,
        watch: crate::source::WatchConfig {
            debounce: Duration::from_millis(20),
            ..crate::source::WatchConfig::default()
        },
        limits: crate::app::ServeLimits {
            connections_per_peer: 256,
            ..crate::app::ServeLimits::default()
        },
        k8s: crate::ca::k8s::K8sConfig::default(),
        server_names: Vec::new(),
    }
}

/// A global allocator that counts the bytes live, forwarding to the system's: for benches and
/// tests that measure heap, e.g. `#[global_allocator] static A: Counting = Counting;`.
#[derive(Debug)]
pub struct Counting;

/// [`Counting`] forwarding to `A`: `CountingWith(tikv_jemallocator::Jemalloc)` times and counts
/// what the `ferry` binary (jemalloc, `crates/cli/src/main.rs`) does. Both count into the one
/// counter [`Counting::live`] reads. Counting is an atomic add on a counter every thread shares
/// (a contended cache line: about a tenth of a busy multi-threaded start-up's CPU);
/// [`Counting::pause`] stops it where only time is measured.
#[derive(Debug)]
pub struct CountingWith<A>(pub A);

/// A value alone on its cache line (and the adjacent one the prefetcher pairs with it).
#[repr(align(128))]
struct Line<T>(T);

static LIVE: Line<std::sync::atomic::AtomicIsize> = Line(std::sync::atomic::AtomicIsize::new(0));
/// Read on every call, written only by [`Counting::pause`] and [`Counting::resume`].
static ON: Line<std::sync::atomic::AtomicBool> = Line(std::sync::atomic::AtomicBool::new(true));

impl Counting {
    /// Bytes allocated while counting and not yet freed (a free while counting of what was
    /// allocated while paused counts too: compare two readings between which nothing
    /// allocated while paused was freed).
    pub fn live() -> isize {
        LIVE.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops counting: allocations cost what the allocator's alone do.
    pub fn pause() {
        ON.0.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts again.
    pub fn resume() {
        ON.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn add(by: isize) {
        if ON.0.load(std::sync::atomic::Ordering::Relaxed) {
            LIVE.0.fetch_add(by, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

// SAFETY: forwards every call to `A` unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl<A: std::alloc::GlobalAlloc> std::alloc::GlobalAlloc for CountingWith<A> {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        Counting::add(l.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { self.0.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        Counting::add(l.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { self.0.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        Counting::add(-(l.size() as isize));
        // SAFETY: same contract as the caller's.
        unsafe { self.0.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        Counting::add(new as isize - l.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { self.0.realloc(p, l, new) }
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        unsafe { CountingWith(std::alloc::System).alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        unsafe { CountingWith(std::alloc::System).alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { CountingWith(std::alloc::System).dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        unsafe { CountingWith(std::alloc::System).realloc(p, l, new) }
    }
}

/// CPU time (user + system) this process has used so far, all its threads, ended ones too
/// (Linux's `/proc/self/stat`, in ticks of 10 ms); zero where that cannot be read.
pub fn cpu_time() -> std::time::Duration {
    /// Linux reports CPU times in these (USER_HZ).
    const TICKS_PER_S: u64 = 100;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces): utime and
    // stime are the 12th and 13th.
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split(' ')
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    std::time::Duration::from_millis(ticks * 1000 / TICKS_PER_S)
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc as _, Layout};

    /// What [`CountingWith`] hands out is its allocator's (jemalloc's size classes answer for
    /// the pointer), counted while live and not while paused.
    #[test]
    #[allow(unsafe_code)]
    fn counted_memory_is_the_inner_allocators() {
        let counting = super::CountingWith(tikv_jemallocator::Jemalloc);
        let layout = Layout::from_size_align(100, 8).expect("a layout");
        // SAFETY: a non-zero size; freed below with the same layout.
        let p = unsafe { counting.alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: `p` is live and came from jemalloc; only jemalloc knows its size class.
        let usable = unsafe { tikv_jemallocator::usable_size(p) };
        assert_eq!(usable, 112, "jemalloc's size class for 100 bytes");
        // SAFETY: allocated above with `layout`.
        unsafe { counting.dealloc(p, layout) };
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let before = super::cpu_time();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        while super::cpu_time() < before + std::time::Duration::from_millis(30)
            && std::time::Instant::now() < deadline
        {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        assert!(super::cpu_time() >= before + std::time::Duration::from_millis(30));
    }
}
