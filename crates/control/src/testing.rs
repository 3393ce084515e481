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

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

impl Counting {
    /// Bytes allocated through [`Counting`] and not yet freed.
    pub fn live() -> isize {
        LIVE.load(std::sync::atomic::Ordering::Relaxed)
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(
            new as isize - l.size() as isize,
            std::sync::atomic::Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.realloc(p, l, new) }
    }
}
