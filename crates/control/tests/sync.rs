//! Control plane and node proxy over real gRPC with TLS, in one process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_control::ca::signer::Ca;
use ferry_control::ca::token::NodeTokens;
use ferry_control::source::{Reloads, TopologyWatch, WatchConfig};
use ferry_control::xds_server::XdsServer;
use ferry_core::model::WorkloadUid;
use ferry_core::store::Store;
use ferry_xds::client::{ClientConfig, XdsClient};
use ferry_xds::resources::{ResourceSet, Versioned};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::{Server, ServerTlsConfig};

const SERVER_NAME: &str = "ferry-control";

fn example() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/two-clusters.yaml"),
    )
    .unwrap()
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A temporary topology file, removed when dropped.
struct TopologyFile(PathBuf);

impl TopologyFile {
    fn new(tag: &str, text: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ferry-xds-{}-{tag}.yaml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        Self(p)
    }
    /// Replaces the file in one step (write aside, rename), so the watcher never reads half an
    /// edit.
    fn write(&self, text: &str) {
        let aside = self.0.with_extension("yaml.tmp");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, &self.0).unwrap();
    }
}

impl Drop for TopologyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct ControlPlane {
    ca: Arc<Ca>,
    tokens: Arc<NodeTokens>,
    addr: SocketAddr,
    resources: watch::Sender<Arc<ResourceSet>>,
    reloads: watch::Receiver<Reloads>,
    server: XdsServer,
    tasks: JoinSet<()>,
}

impl ControlPlane {
    async fn start(file: &TopologyFile, ca: Arc<Ca>, addr: Option<SocketAddr>) -> Self {
        let watch = TopologyWatch::new(file.0.clone(), WatchConfig::default()).unwrap();
        let topo = ferry_topology::load_file(&file.0).unwrap();
        let store = Arc::new(Store::new(topo.snapshot));
        let (res_tx, res_rx) = watch::channel(Arc::new(ferry_control::flatten::resource_set(
            &store.load(),
        )));
        let tokens = Arc::new(NodeTokens::from_secret(&[5; 32]));
        let l = TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        let (reload_tx, reloads) = watch::channel(Reloads::default());
        let server = XdsServer::new(res_rx, Some(tokens.clone()));
        let mut tasks = JoinSet::new();
        tasks.spawn(watch.run(store, res_tx.clone(), reload_tx));
        let (chain, key) = ca
            .issue_server_cert(
                &[SERVER_NAME.into()],
                &[addr.ip()],
                Duration::from_secs(3600),
            )
            .unwrap();
        let tls = ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(chain, key));
        let router = Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(server.clone().into_server());
        tasks.spawn(async move {
            let _ = router
                .serve_with_incoming(
                    tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true)),
                )
                .await;
        });
        Self {
            ca,
            tokens,
            addr,
            resources: res_tx,
            reloads,
            server,
            tasks,
        }
    }

    fn client_config(&self, node: &str) -> ClientConfig {
        ClientConfig {
            endpoint: format!("https://{}", self.addr),
            bundle_pem: self.ca.bundle().concat(),
            server_name: SERVER_NAME.into(),
            token: self.tokens.issue(&node.into()),
            cluster: "east".into(),
            node_id: format!("ferry~{node}"),
            plaintext: false,
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
        }
    }

    async fn stop(mut self) -> Arc<Ca> {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        self.ca
    }
}

fn uids(store: &Store) -> Vec<String> {
    let mut v: Vec<String> = store
        .load()
        .workloads()
        .map(|w| w.uid.to_string())
        .collect();
    v.sort();
    v
}

async fn synced_client(cp: &ControlPlane) -> (XdsClient, Arc<Store>, tokio::task::JoinHandle<()>) {
    let store = Arc::new(Store::default());
    let client = XdsClient::new(cp.client_config("east-1"), store.clone());
    let mut ready = client.ready();
    let task = tokio::spawn(client.clone().run());
    tokio::time::timeout(Duration::from_secs(15), ready.wait_for(|r| *r))
        .await
        .expect("first full sync")
        .unwrap();
    (client, store, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_edits_and_deletions_converge() {
    let file = TopologyFile::new("converge", &example());
    let cp = ControlPlane::start(
        &file,
        Arc::new(Ca::generate("cluster.local").unwrap()),
        None,
    )
    .await;
    let (_client, store, _task) = synced_client(&cp).await;
    let control = ferry_topology::load_file(&file.0).unwrap().snapshot;
    assert_eq!(
        store.load().workloads().count(),
        control.workloads().count()
    );
    assert_eq!(store.load().services().count(), control.services().count());
    assert_eq!(store.load().policies().count(), control.policies().count());
    assert_eq!(store.load().gateways().count(), 2);
    // The same routing decision on both sides of the wire.
    let decide = |snap: &ferry_core::snapshot::Snapshot| {
        let src = snap
            .workloads()
            .find(|w| w.name == "sleep-east")
            .unwrap()
            .clone();
        let dst = ferry_core::route::Destination::Addr("198.18.10.2:80".parse().unwrap());
        let d = ferry_core::route::route(
            snap,
            ferry_core::route::Source::new(&src),
            &dst,
            &mut ferry_core::random::SplitMix64::new(3),
        );
        d.outcome
            .map(|p| (p.landing, p.transport))
            .map_err(|e| e.to_string())
    };
    assert_eq!(decide(&store.load()), decide(&control));
    let before = uids(&store);

    // An edit: move echo-east-2 to a new address.
    file.write(&example().replace("address: 198.18.2.20", "address: 198.18.2.21"));
    eventually("the edit reaches the node", || {
        store.load().workloads().any(|w| {
            w.name == "echo-east-2"
                && w.addresses == ["198.18.2.21".parse::<std::net::IpAddr>().unwrap()]
        })
    })
    .await;
    assert_eq!(uids(&store), before);

    // A deletion: remove exactly one workload.
    let text = example().replace("address: 198.18.2.20", "address: 198.18.2.21");
    let start = text.find("  - name: search-west-1").unwrap();
    let end = start + text[start..].find("  # West's catalog").unwrap();
    file.write(&(text[..start].to_string() + &text[end..]));
    eventually("the deletion reaches the node", || {
        uids(&store).len() == before.len() - 1
    })
    .await;
    let mut expected = before.clone();
    expected.retain(|u| u != "west//v1/Pod/default/search-west-1");
    assert_eq!(
        uids(&store),
        expected,
        "exactly the deleted workload is gone"
    );

    // A bad edit is rejected with a located error; the last good state keeps being served.
    // The watcher counts an edit just after publishing it, so the node can see the deletion
    // before it is counted: wait for both good edits first.
    let mut reloads = cp.reloads.clone();
    let applied = tokio::time::timeout(
        Duration::from_secs(10),
        reloads.wait_for(|r| r.applied >= 2),
    )
    .await
    .unwrap()
    .unwrap()
    .applied;
    file.write("clusters:\n  - {name: east, netwrk: x}\n");
    tokio::time::timeout(
        Duration::from_secs(10),
        reloads.wait_for(|r| r.rejected > 0),
    )
    .await
    .unwrap()
    .unwrap();
    let err = cp.reloads.borrow().last_error.clone().unwrap();
    assert!(err.contains(":2:") && err.contains("netwrk"), "{err}");
    assert_eq!(cp.reloads.borrow().applied, applied);
    assert_eq!(uids(&store), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resyncs_with_only_the_difference_and_no_stale_entries() {
    let file = TopologyFile::new("restart", &example());
    let cp = ControlPlane::start(
        &file,
        Arc::new(Ca::generate("cluster.local").unwrap()),
        None,
    )
    .await;
    let addr = cp.addr;
    let (client, store, _task) = synced_client(&cp).await;
    let before = uids(&store);
    let sessions = client.state().lock().sessions;
    let ca = cp.stop().await;
    // While the control plane is away, the node keeps its last good state.
    assert_eq!(uids(&store), before);
    // It comes back with one workload fewer.
    let text = example();
    let start = text.find("  - name: search-west-1").unwrap();
    let end = start + text[start..].find("  # West's catalog").unwrap();
    file.write(&(text[..start].to_string() + &text[end..]));
    let _cp = ControlPlane::start(&file, ca, Some(addr)).await;
    eventually("the client reconnects and converges", || {
        uids(&store).len() == before.len() - 1
    })
    .await;
    let st = client.state();
    eventually("the new session is the one that applied it", || {
        st.lock().sessions > sessions
    })
    .await;
    assert!(
        !uids(&store).contains(&"west//v1/Pod/default/search-west-1".to_string()),
        "no stale entry"
    );
    // Besides the removal, only `search` is sent again: its only endpoint left, so the SANs
    // a stock peer checks for it changed with it.
    assert_eq!(
        st.lock().received_this_session,
        1,
        "nothing but the removal and the service whose endpoints changed was sent again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_resource_is_nacked_by_name_and_the_rest_applies() {
    let file = TopologyFile::new("nack", &example());
    let cp = ControlPlane::start(
        &file,
        Arc::new(Ca::generate("cluster.local").unwrap()),
        None,
    )
    .await;
    let (client, store, _task) = synced_client(&cp).await;
    let count = store.load().workloads().count();
    // Push a set with one extra good workload and one malformed one.
    let mut set = (**cp.resources.borrow()).clone();
    let types = set.by_type.get_mut(ferry_api::ADDRESS_TYPE).unwrap();
    let good = types
        .get("east//v1/Pod/default/sleep-east")
        .unwrap()
        .clone();
    let mut decoded =
        <ferry_api::workload::Address as prost::Message>::decode(good.body.as_slice()).unwrap();
    if let Some(ferry_api::workload::address::Type::Workload(w)) = &mut decoded.r#type {
        w.uid = "east//v1/Pod/default/sleep-east-2".into();
        w.name = "sleep-east-2".into();
        w.addresses = vec![vec![198, 18, 1, 11]];
    }
    types.insert(
        "east//v1/Pod/default/sleep-east-2".into(),
        Versioned::new(prost::Message::encode_to_vec(&decoded)),
    );
    let mut bad = decoded.clone();
    if let Some(ferry_api::workload::address::Type::Workload(w)) = &mut bad.r#type {
        w.uid = "east//v1/Pod/default/broken".into();
        w.name = "broken".into();
        w.addresses = vec![vec![1, 2, 3]];
    }
    types.insert(
        "east//v1/Pod/default/broken".into(),
        Versioned::new(prost::Message::encode_to_vec(&bad)),
    );
    cp.resources.send_replace(Arc::new(set));
    eventually("the good resource applies", || {
        store
            .load()
            .workload(&WorkloadUid::new("east//v1/Pod/default/sleep-east-2"))
            .is_some()
    })
    .await;
    assert_eq!(store.load().workloads().count(), count + 1);
    let rejected = client.state().lock().last_rejected.clone();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].name, "east//v1/Pod/default/broken");
    assert!(
        rejected[0]
            .reason
            .contains("an address must be 4 or 16 bytes, found 3"),
        "{}",
        rejected[0].reason
    );
    let metrics = cp.server.metrics();
    eventually("the control plane counts the NACK", || {
        metrics.nacks.get() == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_configuration_without_a_valid_credential_or_a_trusted_server() {
    let file = TopologyFile::new("auth", &example());
    let cp = ControlPlane::start(
        &file,
        Arc::new(Ca::generate("cluster.local").unwrap()),
        None,
    )
    .await;
    let mut forged = cp.client_config("east-1");
    forged.token = NodeTokens::from_secret(&[6; 32]).issue(&"east-1".into());
    let mut untrusting = cp.client_config("east-1");
    untrusting.bundle_pem = Ca::generate("cluster.local").unwrap().bundle().concat();
    for config in [forged, untrusting] {
        let store = Arc::new(Store::default());
        let client = XdsClient::new(config, store.clone());
        let task = tokio::spawn(client.clone().run());
        let st = client.state();
        eventually("the client tried several times", || {
            st.lock().attempts >= 3 || st.lock().generation > 0
        })
        .await;
        assert_eq!(st.lock().generation, 0, "nothing was received");
        assert_eq!(store.load().workloads().count(), 0);
        assert!(!*client.ready().borrow());
        task.abort();
    }
    assert!(cp.server.metrics().refused.get() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_is_read_from_its_file_at_each_connect() {
    let file = TopologyFile::new("token-file", &example());
    let cp = ControlPlane::start(
        &file,
        Arc::new(Ca::generate("cluster.local").unwrap()),
        None,
    )
    .await;
    let token_file = std::env::temp_dir().join(format!("ferry-xds-token-{}", std::process::id()));
    std::fs::write(&token_file, cp.tokens.issue(&"east-1".into())).unwrap();
    let mut config = cp.client_config("east-1");
    // What it was started with no longer works: only the file's token does (a rotated
    // projected token).
    config.token = "expired".into();
    let store = Arc::new(Store::default());
    let client = XdsClient::new(config, store.clone()).with_token_file(token_file.clone());
    let mut ready = client.ready();
    let _task = tokio::spawn(client.run());
    tokio::time::timeout(Duration::from_secs(15), ready.wait_for(|r| *r))
        .await
        .expect("synced with the file's token")
        .unwrap();
    assert!(store.load().workloads().count() > 0);
    let _ = std::fs::remove_file(&token_file);
}
