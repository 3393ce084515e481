//! What the initial sync costs a node proxy, without the network: the control plane's whole
//! resource set as the two responses it sends (bytes, as they come off the stream), decoded and
//! applied by [`XdsClient::apply`] into the node's store, as a session does.
//!
//! Reported per mesh: the time to decode and apply both responses (the median of five runs,
//! and each run; `FERRY_NODE_SYNC_RUNS` sets how many), split into the responses' protobuf
//! decoding and [`XdsClient::apply`]; what the apply spends converting the resources to the
//! model and assembling the snapshot with its indexes (each timed alone, medians of as many
//! runs); the heap the node keeps after (its snapshot and the client's held resources), the
//! peak heap while applying, and what one workload and one service keep: the services alone
//! are synced first, and a workload costs
//! `(heap - services' heap) / workloads`.
//!
//! The mesh is `ferry_control::testing::generated_topology`'s: two clusters on two networks,
//! 100 nodes (1,000 for a million workloads), workload `i` labelled `app: svc(i % services)`
//! with service account `sa(i % services)` and backing that service, every even service
//! global; one namespace policy.
//!
//! Run: `cargo bench -p ferry-xds --bench node_sync`. `FERRY_NODE_SYNC_SIZES` lists the meshes
//! as `workloads/services` (default `10000/1000,100000/1000`); `1000000/66000` is the
//! reference's million pods (about a minute to generate and encode, 6 GB for the bench).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use ferry_api::discovery::{DeltaDiscoveryResponse, Resource};
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_core::model::{
    Action, Cluster, Locality, Node, Policy, PolicyScope, PortMapping, Rule, ServiceScope,
    StringMatch,
};
use ferry_core::snapshot::SnapshotBuilder;
use ferry_core::store::Store;
use ferry_core::testing::MeshBuilder;
use ferry_xds::assemble::{Held, assemble};
use ferry_xds::client::{ClientConfig, XdsClient};
use ferry_xds::convert::{self, Decoded, Interner};
use ferry_xds::resources::ResourceSet;
use prost::Message;
use tikv_jemallocator::Jemalloc;

/// jemalloc, as the `ferry` binary that runs the node proxy uses, counting live bytes and their
/// peak. Each thread counts its own and adds them to the totals every [`FLUSH`] bytes of change:
/// one counter updated by every thread at every allocation is a cache line the cores pass back
/// and forth, a cost the node proxy (which does not count) does not pay. The totals are off by
/// less than [`FLUSH`] per thread.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Bytes of change a thread counts before adding them to the totals.
const FLUSH: isize = 64 << 10;

thread_local! {
    /// This thread's change not yet in [`LIVE`] (no destructor: usable inside the allocator).
    static PENDING: Cell<isize> = const { Cell::new(0) };
}

fn grew(by: isize) {
    let add = |n: isize| {
        let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(now, Ordering::Relaxed);
    };
    let flushed = PENDING.try_with(|p| {
        let n = p.get() + by;
        if n.abs() >= FLUSH {
            p.set(0);
            add(n);
        } else {
            p.set(n);
        }
    });
    if flushed.is_err() {
        // The thread is ending: straight to the totals.
        add(by);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grew(l.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { Jemalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        grew(-(l.size() as isize));
        // SAFETY: same contract as the caller's.
        unsafe { Jemalloc.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        grew(new as isize - l.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { Jemalloc.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Live bytes, with this thread's change not yet added.
fn live() -> isize {
    LIVE.load(Ordering::Relaxed) + PENDING.with(Cell::get)
}

fn mib(b: isize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// The generated topology's mesh as the control plane serves it, encoded.
fn resource_set(workloads: usize, services: usize) -> ResourceSet {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    let nodes = if workloads > 100_000 { 1_000 } else { 100 };
    for n in 0..nodes {
        let cluster = if n % 2 == 0 { "east" } else { "west" };
        m.node(
            &format!("node{n}"),
            cluster,
            &format!("r{}/z{}/", n % 2, n % 4),
        );
    }
    for s in 0..services {
        let net = if s % 2 == 0 { "net-east" } else { "net-west" };
        let vip = format!("10.{}.{}.{}", 200 + s / 62_500, s / 250 % 250, s % 250 + 1);
        let svc = m.service(&format!("svc{s}"), &[(net, vip.as_str())], 80, 8080);
        svc.scope = if s % 2 == 0 {
            ServiceScope::global()
        } else {
            ServiceScope::local()
        };
    }
    let keys: Vec<_> = m.services.iter().map(|s| s.key()).collect();
    m.policy(Policy {
        name: "allow-default".into(),
        namespace: "default".into(),
        scope: PolicyScope::Namespace,
        action: Action::Allow,
        rules: vec![Rule {
            clauses: vec![ferry_core::model::Clause {
                matches: vec![ferry_core::model::Match {
                    namespaces: vec![StringMatch::Exact("default".into())],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: false,
    });
    // Straight into a builder: a million workloads are not copied twice.
    let mut b = SnapshotBuilder::new(1);
    for c in &m.clusters {
        b.cluster(Cluster::clone(c));
    }
    for n in &m.nodes {
        b.node(Node::clone(n));
    }
    for s in m.services.drain(..) {
        b.service(s);
    }
    for p in m.policies.drain(..) {
        b.policy(p);
    }
    let node_localities: Vec<Arc<Locality>> = m
        .nodes
        .iter()
        .map(|n| Arc::new(n.locality.clone()))
        .collect();
    for i in 0..workloads {
        let n = i % nodes;
        let j = i / 2;
        let a = format!("10.{}.{}.{}", j / 62_500, j / 250 % 250, j % 250 + 1);
        let w = m.pod(&format!("pod{i}"), &format!("node{n}"), &a);
        let s = i % services;
        w.service_account = format!("sa{s}");
        w.labels = BTreeMap::from([("app".into(), format!("svc{s}"))]).into();
        w.locality = node_localities[n].clone();
        w.services = BTreeMap::from([(
            keys[s].clone(),
            vec![PortMapping {
                service_port: 80,
                target_port: 8080,
            }],
        )])
        .into();
        b.workload(m.workloads.pop().expect("just made"));
    }
    let snap = b.build().expect("the generated mesh is valid");
    ResourceSet::encode(&snap)
}

/// The set's resources of `type_url` as one response, in bytes.
fn response(set: &ResourceSet, type_url: &str, nonce: &str) -> Vec<u8> {
    let resources = set
        .of_type(type_url)
        .into_iter()
        .flat_map(|t| t.iter())
        .map(|(name, v)| Resource {
            version: v.version.clone(),
            resource: Some(prost_types::Any {
                type_url: type_url.to_string(),
                value: (*v.body).clone(),
            }),
            name: name.clone(),
            aliases: vec![],
        })
        .collect();
    DeltaDiscoveryResponse {
        type_url: type_url.to_string(),
        nonce: nonce.to_string(),
        resources,
        ..Default::default()
    }
    .encode_to_vec()
}

struct Synced {
    took: Duration,
    /// Of `took`, the responses' protobuf decoding.
    wire: Duration,
    kept: isize,
    peak: isize,
}

/// Applies the two responses to a fresh client, as a session's first pushes.
fn sync(addresses: &[u8], policies: &[u8], workloads: usize) -> Synced {
    let before = live();
    PEAK.store(before, Ordering::Relaxed);
    let store = Arc::new(Store::default());
    let client = XdsClient::new(
        ClientConfig {
            endpoint: "https://127.0.0.1:15012".into(),
            bundle_pem: String::new(),
            server_name: "ferry-control".into(),
            token: String::new(),
            cluster: "east".into(),
            node_id: "ferry~node0".into(),
            plaintext: false,
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
        },
        store.clone(),
    );
    let start = Instant::now();
    let mut wire = Duration::ZERO;
    for bytes in [addresses, policies] {
        let decoding = Instant::now();
        let r = DeltaDiscoveryResponse::decode(bytes).expect("a response");
        wire += decoding.elapsed();
        let ack = client.apply(r);
        assert!(ack.error_detail.is_none(), "NACK: {:?}", ack.error_detail);
    }
    let took = start.elapsed();
    assert_eq!(store.load().workloads().count(), workloads);
    let synced = Synced {
        took,
        wire,
        kept: live() - before,
        peak: PEAK.load(Ordering::Relaxed) - before,
    };
    drop((client, store));
    synced
}

/// What the apply spends on two of its parts, each timed alone: converting the resources to
/// the model (through one interner, as a client does), and assembling the snapshot with its
/// indexes from them.
struct Parts {
    convert: Duration,
    assemble: Duration,
}

fn parts(addresses: &[u8], policies: &[u8]) -> Parts {
    let [a, p] =
        [addresses, policies].map(|b| DeltaDiscoveryResponse::decode(b).expect("a response"));
    let start = Instant::now();
    let mut intern = Interner::default();
    let mut held = Held::default();
    for r in &a.resources {
        let body = r
            .resource
            .as_ref()
            .map(|x| x.value.as_slice())
            .unwrap_or_default();
        let d: Decoded = convert::decode_address_with(&mut intern, &r.name, body).expect("valid");
        held.addresses.insert(r.name.as_str().into(), d);
    }
    for r in &p.resources {
        let body = r
            .resource
            .as_ref()
            .map(|x| x.value.as_slice())
            .unwrap_or_default();
        let policy = convert::decode_authorization(&r.name, body).expect("valid");
        held.policies.insert(r.name.clone(), Arc::new(policy));
    }
    let convert = start.elapsed();
    let start = Instant::now();
    let (snap, rejected) = assemble(&held, 1);
    let assemble = start.elapsed();
    assert!(snap.is_some() && rejected.is_empty(), "{rejected:?}");
    drop((snap, held, intern));
    Parts { convert, assemble }
}

fn median(mut d: Vec<Duration>) -> f64 {
    d.sort();
    d[d.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let sizes =
        std::env::var("FERRY_NODE_SYNC_SIZES").unwrap_or_else(|_| "10000/1000,100000/1000".into());
    for size in sizes.split(',') {
        let (w, s) = size
            .split_once('/')
            .and_then(|(w, s)| Some((w.trim().parse().ok()?, s.trim().parse().ok()?)))
            .expect("FERRY_NODE_SYNC_SIZES: workloads/services,...");
        run(w, s);
    }
}

fn run(workloads: usize, services: usize) {
    let made = Instant::now();
    let set = resource_set(workloads, services);
    let addresses = response(&set, ADDRESS_TYPE, "1");
    let policies = response(&set, AUTHORIZATION_TYPE, "2");
    drop(set);
    let services_only = {
        let set = resource_set(0, services);
        let a = response(&set, ADDRESS_TYPE, "1");
        let p = response(&set, AUTHORIZATION_TYPE, "2");
        drop(set);
        sync(&a, &p, 0)
    };
    eprintln!(
        "{workloads} workloads, {services} services: generated and encoded in {:.1} s, {:.1} MiB on the wire",
        made.elapsed().as_secs_f64(),
        mib((addresses.len() + policies.len()) as isize)
    );
    // The median time (and each run's), and the memory (the same in every run).
    let n = std::env::var("FERRY_NODE_SYNC_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5usize)
        .max(1);
    let runs: Vec<Synced> = (0..n)
        .map(|_| sync(&addresses, &policies, workloads))
        .collect();
    let times: Vec<f64> = runs.iter().map(|r| r.took.as_secs_f64() * 1e3).collect();
    let best = runs.iter().min_by_key(|r| r.took).expect("a run");
    let wire = median(runs.iter().map(|r| r.wire).collect());
    let took = median(runs.iter().map(|r| r.took).collect());
    let alone: Vec<Parts> = (0..n).map(|_| parts(&addresses, &policies)).collect();
    let per_workload = (best.kept - services_only.kept) / workloads.max(1) as isize;
    println!(
        "{workloads} workloads, {services} services: initial sync decoded and applied in {took:.0} ms \
         (median; runs: {}): protobuf {wire:.0} ms, apply {:.0} ms; timed alone, converting {:.0} ms, \
         assembling the snapshot {:.0} ms; \
         node heap kept {:.1} MiB, peak {:.1} MiB; {} bytes per workload, {} bytes per service",
        times
            .iter()
            .map(|t| format!("{t:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        median(runs.iter().map(|r| r.took - r.wire).collect()),
        median(alone.iter().map(|p| p.convert).collect()),
        median(alone.iter().map(|p| p.assemble).collect()),
        mib(best.kept),
        mib(best.peak),
        per_workload,
        services_only.kept / services.max(1) as isize,
    );
}
