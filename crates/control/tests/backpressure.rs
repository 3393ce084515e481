//! Flow control on the xDS server, over real gRPC and TLS: a node that stops reading stops the
//! server building pushes for it once one waits for the transport (memory stays bounded however
//! many edits happen) and, when it reads again, it is brought to the latest state in one
//! difference instead of every version in between; a burst of edits reaches a node that keeps reading as fewer pushes than edits (the
//! push interval).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::ADDRESS_TYPE;
use ferry_api::workload::Address;
use ferry_api::workload::address::Type;
use ferry_control::ca::signer::Ca;
use ferry_control::ca::token::NodeTokens;
use ferry_control::metrics::Metrics;
use ferry_control::testing::Counting;
use ferry_control::testing::sim::{Sim, SimConfig};
use ferry_control::xds_server::XdsServer;
use ferry_xds::resources::{ResourceSet, Versioned};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::{Server, ServerTlsConfig};

#[global_allocator]
static GLOBAL: Counting = Counting;

const POD0: &str = "east//v1/Pod/default/pod0";

/// The heap counter is the process's: the memory test reads it with no other test allocating
/// alongside, so the tests here run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Polls `cond` every 10 ms until it holds; panics naming `what` after 60 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn mib(b: isize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// The served set of a generated topology of `workloads` pods.
fn mesh(workloads: usize) -> ResourceSet {
    let text = ferry_control::testing::generated_topology(workloads, workloads / 20, 0);
    let topology = ferry_topology::parse("generated", &text).expect("the generated topology");
    ferry_control::flatten::resource_set(&topology.snapshot)
}

/// `set` with the workloads named in `names` given capacity `capacity` (encoded again).
fn with_capacity(set: &ResourceSet, names: &[String], capacity: u32) -> ResourceSet {
    let mut next = set.clone();
    let Some(addresses) = next.by_type.get_mut(ADDRESS_TYPE) else {
        return next;
    };
    for name in names {
        let Some(v) = addresses.get(name) else {
            continue;
        };
        let mut a = Address::decode(v.body.as_slice()).expect("a served address decodes");
        if let Some(Type::Workload(w)) = &mut a.r#type {
            w.capacity = Some(capacity);
        }
        addresses.insert(name.clone(), Versioned::new(a.encode_to_vec()));
    }
    next
}

/// The workloads of `set`.
fn workload_names(set: &ResourceSet) -> Vec<String> {
    set.of_type(ADDRESS_TYPE)
        .map(|t| t.keys().filter(|n| n.contains("/Pod/")).cloned().collect())
        .unwrap_or_default()
}

/// The bytes of `set`'s resources.
fn bytes(set: &ResourceSet) -> usize {
    set.by_type
        .values()
        .flat_map(|t| t.values())
        .map(|v| v.body.len())
        .sum()
}

struct Served {
    addr: SocketAddr,
    bundle_pem: String,
    tokens: Arc<NodeTokens>,
    resources: watch::Sender<Arc<ResourceSet>>,
    metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start(set: ResourceSet, push_interval: Duration) -> Self {
        let ca = Ca::generate("cluster.local").unwrap();
        let tokens = Arc::new(NodeTokens::from_secret(&[3; 32]));
        let (resources, rx) = watch::channel(Arc::new(set));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (chain, key) = ca
            .issue_server_cert(
                &[ferry_control::app::SERVER_NAME.into()],
                &[addr.ip()],
                Duration::from_secs(3600),
            )
            .unwrap();
        let server = XdsServer::new(rx, Some(tokens.clone())).with_push_interval(push_interval);
        let metrics = server.metrics();
        let router = Server::builder()
            .tls_config(
                ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(chain, key)),
            )
            .unwrap()
            .add_service(server.into_server());
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l))
                .await;
        });
        Self {
            addr,
            bundle_pem: ca.bundle().concat(),
            tokens,
            resources,
            metrics,
            task,
        }
    }

    fn sim(&self, node: &str, window: Option<u32>) -> SimConfig {
        SimConfig {
            addr: self.addr,
            bundle_pem: self.bundle_pem.clone(),
            token: self.tokens.issue(&node.into()),
            node: node.into(),
            window,
        }
    }

    /// Publishes `set` as the served state.
    fn publish(&self, set: ResourceSet) {
        drop(self.resources.send_replace(Arc::new(set)));
    }

    /// What the server serves now, name -> version, per type.
    fn versions(&self) -> HashMap<String, HashMap<String, String>> {
        self.resources
            .borrow()
            .by_type
            .iter()
            .map(|(t, r)| {
                let v = r
                    .iter()
                    .map(|(n, v)| (n.clone(), v.version.clone()))
                    .collect();
                ((*t).to_string(), v)
            })
            .collect()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Live heap once it has stopped moving (allocations freed by other tasks settle).
async fn settled_heap() -> isize {
    // Quiet for three samples in a row: a task held back on a loaded machine may still be
    // freeing what it held after one.
    let mut last = Counting::live();
    let mut quiet = 0;
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = Counting::live();
        quiet = if (now - last).abs() < 16 << 10 {
            quiet + 1
        } else {
            0
        };
        if quiet == 3 || Instant::now() > end {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_keeps_server_memory_bounded_and_then_gets_the_final_state() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let base = mesh(6_000);
    let names = workload_names(&base);
    let set_bytes = bytes(&base);
    // The first push alone is larger than what HTTP/2 lets the server hand over to a node that
    // grants a 1 KiB window and does not read: the stream stalls within it.
    assert!(set_bytes > 1 << 20, "the mesh is {set_bytes} bytes");
    let served = Served::start(base.clone(), Duration::from_millis(1)).await;
    let mut stalled = Sim::connect(&served.sim("stalled", Some(1024)), &[POD0])
        .await
        .expect("the node connects");
    let metrics = served.metrics.clone();
    eventually("the server building the first push", || {
        metrics.pushes.get() >= 1
    })
    .await;
    let before = settled_heap().await;
    // What one more served set weighs (its map and its new bodies).
    let one_set = {
        let s = with_capacity(&base, &names, 99);
        let with = settled_heap().await;
        drop(s);
        with - settled_heap().await
    };

    // 50 edits, each changing every workload (so one queued push would weigh as much as the
    // whole mesh), while the node reads nothing.
    for edit in 1..=50 {
        served.publish(with_capacity(&base, &names, 100 + edit));
        tokio::task::yield_now().await;
    }
    // The served set besides the one the node was last sent, at most one push waiting for the
    // transport (as heavy as a set here), and little else: not a push per edit. Measured again
    // until within it, for a while: what is still in flight goes.
    let bound = 3 * one_set + (2 << 20);
    let end = Instant::now() + Duration::from_secs(30);
    let mut during = settled_heap().await;
    while during - before > bound && Instant::now() < end {
        during = settled_heap().await;
    }
    let pushes_stalled = metrics.pushes.get();
    assert!(
        during - before <= bound,
        "the server's heap grew by {:.1} MiB over 50 edits to a stalled node (bound {:.1} MiB, one set weighs {:.1} MiB; {pushes_stalled} pushes built)",
        mib(during - before),
        mib(bound),
        mib(one_set),
    );

    // The node reads again: the first push, then one difference to the final state.
    let end = Instant::now() + Duration::from_secs(60);
    while stalled.capacity(POD0) != Some(150) || !stalled.synced() {
        assert!(
            Instant::now() < end,
            "timed out waiting for the final state at the node"
        );
        let read = tokio::time::timeout_at(end, stalled.next()).await;
        read.expect("a push within the deadline")
            .expect("the stream stays healthy")
            .expect("the stream stays open");
    }
    assert_eq!(
        stalled.versions,
        served.versions(),
        "the node holds exactly what the server serves"
    );
    let addresses = stalled.responses.get(ADDRESS_TYPE).copied().unwrap_or(0);
    // The first push, the one that waited for the transport (built from the version current
    // then), and one difference to the latest state.
    assert!(
        addresses <= 3,
        "the node got {addresses} address pushes for its first sync and 50 edits; expected the first push, at most one waiting and one to the latest state (server built {pushes_stalled} pushes while it stalled)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_edits_reaches_a_reading_node_as_fewer_pushes() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let base = mesh(200);
    let served = Served::start(base.clone(), Duration::from_secs(1)).await;
    let mut node = Sim::connect(&served.sim("reader", None), &[POD0])
        .await
        .expect("the node connects");
    while !node.synced() {
        node.next().await.unwrap().unwrap();
    }
    let reader = tokio::spawn(async move {
        // Reads as fast as pushes come, until the final edit is in.
        while node.capacity(POD0) != Some(150) {
            let r = node.next().await;
            r.expect("the stream stays healthy")
                .expect("the stream stays open");
        }
        node
    });
    // 50 one-workload edits, 10 ms apart: each would be a push of its own without the interval.
    let pod0 = vec![POD0.to_string()];
    for edit in 1..=50 {
        served.publish(with_capacity(&base, &pod0, 100 + edit));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let node = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the final edit arrives in time")
        .expect("the reader ran");
    let after_sync = node.responses.get(ADDRESS_TYPE).copied().unwrap_or(0) - 1;
    assert!(
        after_sync <= 10,
        "50 edits in a burst became {after_sync} address pushes; expected them coalesced by the 1 s push interval"
    );
    assert_eq!(node.capacity(POD0), Some(150));
}
