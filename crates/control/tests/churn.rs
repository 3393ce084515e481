//! Memory that does not grow with connections or reloads: `ferry control`'s own composition
//! (`app::serve`, real TLS, the watched file) through many reconnects and topology edits, with
//! the live heap counted by the allocator.
//!
//! Each round connects three more nodes, edits the topology once and disconnects them (20 rounds
//! after two of warm-up; `FERRY_CHURN_ROUNDS` changes it). `FERRY_CHURN_WORKLOADS=20000 cargo
//! test --release -p ferry-control --test churn -- --nocapture` runs it at a size where the
//! figures mean something (and prints them).

use std::sync::Arc;
use std::time::Duration;

use ferry_control::testing::Counting;
use ferry_control::testing::control::Control;
use ferry_core::model::WorkloadUid;
use ferry_core::store::Store;
use ferry_xds::client::{ClientConfig, XdsClient};
use tokio::time::Instant;

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    Counting::live()
}

fn mib(b: isize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// The resident set, from `/proc/self/statm` (for the printout; the bound is on the live heap).
fn rss() -> isize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: isize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Polls `cond` every 10 ms until it holds; panics naming `what` after `patience`.
async fn eventually(what: &str, patience: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + patience;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A real node proxy's xDS client of `control`, as `node`.
fn client(control: &Control, node: &str) -> (XdsClient, Arc<Store>) {
    let store = Arc::new(Store::default());
    let config = ClientConfig {
        endpoint: format!("https://{}", control.listening.addr),
        bundle_pem: control.bundle().unwrap(),
        server_name: ferry_control::app::SERVER_NAME.into(),
        token: control.token(node).unwrap(),
        cluster: "east".into(),
        node_id: format!("ferry~{node}"),
        plaintext: false,
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
    };
    (XdsClient::new(config, store.clone()), store)
}

/// `ferry_xds_streams_open` from the metrics endpoint.
async fn streams_open(metrics: std::net::SocketAddr) -> Option<u64> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(metrics).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: control\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix("ferry_xds_streams_open "))
        .and_then(|v| v.trim().parse().ok())
}

fn capacity(store: &Store) -> Option<u32> {
    store
        .load()
        .workload(&WorkloadUid::new("east//v1/Pod/default/pod0"))
        .map(|w| w.capacity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_through_reconnects_and_reloads() {
    let workloads: usize = std::env::var("FERRY_CHURN_WORKLOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let services = (workloads / 20).max(10);
    let generated = |edit| ferry_control::testing::generated_topology(workloads, services, edit);
    let control = Control::start("churn", &generated(0)).await.unwrap();
    let listening = control.listening;
    let patience = Duration::from_secs(30);

    // One node stays connected throughout and sees every edit.
    let (watcher, watched) = client(&control, "node0");
    let watcher_task = tokio::spawn(watcher.run());
    eventually("the first sync", patience, || capacity(&watched) == Some(1)).await;

    // Each round: a few nodes connect and sync, the topology is edited, they disconnect.
    let round = |edit: u32| {
        let control = &control;
        let watched = &watched;
        let generated = &generated;
        async move {
            let clients: Vec<_> = (0..3)
                .map(|i| {
                    let (c, store) = client(control, &format!("node{}", 1 + i));
                    (tokio::spawn(c.run()), store)
                })
                .collect();
            for (_, store) in &clients {
                eventually("a new node's sync", patience, || capacity(store).is_some()).await;
            }
            control.replace(&generated(edit)).unwrap();
            eventually("the edit at every node", patience, || {
                capacity(watched) == Some(edit + 1)
                    && clients.iter().all(|(_, s)| capacity(s) == Some(edit + 1))
            })
            .await;
            for (task, _) in clients {
                task.abort();
                let _ = task.await;
            }
        }
    };
    // Warm up: the first rounds size the runtime's, TLS's and HTTP/2's buffers.
    for edit in 1..=2 {
        round(edit).await;
    }
    let settled = |what: &'static str| async move {
        // Disconnects are seen by the server a moment later: wait for the heap to stop falling.
        let mut last = live();
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = live();
            if (now - last).abs() < 64 << 10 || Instant::now() > end {
                println!(
                    "{what}: live heap {:.1} MiB, RSS {:.1} MiB",
                    mib(now),
                    mib(rss())
                );
                return now;
            }
            last = now;
        }
    };
    let base = settled("after warm-up").await;
    let rounds: u32 = std::env::var("FERRY_CHURN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for edit in 3..3 + rounds {
        round(edit).await;
    }
    // Structurally: every stream of a disconnected node has ended; only the watcher's is open.
    let end = Instant::now() + patience;
    while streams_open(listening.metrics_addr).await != Some(1) {
        assert!(
            Instant::now() < end,
            "timed out waiting for the streams of disconnected nodes to end: {:?} open",
            streams_open(listening.metrics_addr).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bound = base / 10 + (4 << 20);
    let end = Instant::now() + patience;
    let after = loop {
        let now = settled("after the rounds").await;
        if now - base <= bound || Instant::now() > end {
            break now;
        }
    };
    assert!(
        after - base <= bound,
        "the live heap grew by {:.1} MiB over {rounds} rounds of 3 connections and a reload (from {:.1} MiB; bound {:.1} MiB)",
        mib(after - base),
        mib(base),
        mib(bound),
    );

    watcher_task.abort();
}
