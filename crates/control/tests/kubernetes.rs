//! `ferry control serve --cluster-id` reading two clusters (the local one by kubeconfig, the
//! remote one by an Istio remote secret) from in-process list/watch API servers, serving a
//! node proxy's xDS client: the clusters' objects reach it, and so does a change.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_control::app::{Config, Listening, ServeLimits, Source};
use ferry_control::kube_source::KubeSource;
use ferry_control::source::WatchConfig;
use ferry_core::store::Store;
use ferry_k8s::testing::ApiServer;
use ferry_xds::client::{ClientConfig, XdsClient};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../k8s/tests/fixtures/two-clusters/{name}.yaml")),
    )
    .unwrap()
}

fn kubeconfig(server: &ApiServer, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: {name}, cluster: {{server: 'http://{}'}}}}]\nusers: [{{name: {name}, user: {{}}}}]\ncontexts: [{{name: {name}, context: {{cluster: {name}, user: {name}}}}}]\ncurrent-context: {name}\n",
        server.addr
    )
}

/// A temporary directory, removed when dropped.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn has(store: &Store, name: &str) -> bool {
    store.load().workloads().any(|w| w.name == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_read_from_kubernetes_reach_a_node_proxy() {
    let alpha = ApiServer::start(&[&fixture("alpha")]).await;
    let beta = ApiServer::start(&[&fixture("beta")]).await;
    let dir = Dir(std::env::temp_dir().join(format!("ferry-k8s-control-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let local = dir.0.join("kubeconfig");
    std::fs::write(&local, kubeconfig(&alpha, "alpha")).unwrap();
    let secret = dir.0.join("remote-secret-beta.yaml");
    let indented: String = kubeconfig(&beta, "beta")
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect();
    std::fs::write(
        &secret,
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: istio-remote-secret-beta\n  namespace: istio-system\n  labels: {{istio/multiCluster: \"true\"}}\nstringData:\n  beta: |\n{indented}"
        ),
    )
    .unwrap();

    let plane = Plane::start(
        KubeSource {
            cluster_id: "alpha".into(),
            network: None,
            kubeconfig: Some(local),
            remote_secrets: vec![secret],
            remote_secrets_namespace: None,
            lease: None,
            mesh: ferry_k8s::MeshConfig::default(),
            initial_sync: Duration::from_secs(10),
        },
        &dir,
    )
    .await;
    let (listening, store) = (plane.listening, plane.store.clone());
    eventually("both clusters' pods reach the node proxy", || {
        has(&store, "sleep") && has(&store, "echo-beta")
    })
    .await;

    // A pod started in the remote cluster reaches it too.
    beta.apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "echo-beta-2", "namespace": "default", "labels": {"app": "echo"}, "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"nodeName": "beta-1", "serviceAccountName": "echo", "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "198.18.3.21", "conditions": [{"type": "Ready", "status": "True"}]},
    }));
    eventually("the new pod reaches the node proxy", || {
        has(&store, "echo-beta-2")
    })
    .await;

    // A policy Ferry cannot enforce exactly fails closed, and the metrics name it.
    beta.apply(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "jwt", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "echo"}}, "action": "ALLOW",
                 "rules": [{"from": [{"source": {"requestPrincipals": ["issuer/subject"]}}]}]},
    }));
    let line =
        "ferry_kubernetes_notes{cluster=\"beta\",object=\"AuthorizationPolicy default/jwt\"} 1";
    let end = tokio::time::Instant::now() + DEADLINE;
    while !fetch(listening.metrics_addr, "/metrics")
        .await
        .contains(line)
    {
        assert!(tokio::time::Instant::now() < end, "no metric line {line}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The admin endpoint shows both clusters synced.
    let status = fetch(listening.metrics_addr, "/debug/kubernetes").await;
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["clusters"]["alpha"]["synced"], json!(true), "{status}");
    assert_eq!(v["clusters"]["beta"]["synced"], json!(true), "{status}");
    alpha.stop();
    beta.stop();
}

/// A control plane reading `source`, and a node proxy's xDS client of it; both stop when
/// dropped.
struct Plane {
    listening: Listening,
    store: Arc<Store>,
    node: tokio::task::JoinHandle<()>,
    /// Shuts the control plane down, its watch and election with it (aborting its task would
    /// leave them running), when dropped.
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        self.node.abort();
    }
}

impl Plane {
    async fn start(source: KubeSource, dir: &Dir) -> Self {
        let config = Config {
            source: Source::Kubernetes(Box::new(source)),
            state_dir: dir.0.join("state"),
            listen: "127.0.0.1:0".parse().unwrap(),
            ca: None,
            extra_roots: None,
            max_lifetime: Duration::from_secs(3600),
            metrics_listen: "127.0.0.1:0".parse().unwrap(),
            plaintext: true,
            watch: WatchConfig::default(),
            limits: ServeLimits::default(),
            k8s: Default::default(),
            server_names: vec![],
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<Listening>();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            ferry_control::app::serve(
                &config,
                |l| {
                    let _ = tx.send(*l);
                },
                async move {
                    let _ = stop.await;
                },
            )
            .await
            .unwrap();
        });
        let listening = tokio::time::timeout(DEADLINE, rx).await.unwrap().unwrap();
        let store = Arc::new(Store::default());
        let client = XdsClient::new(
            ClientConfig {
                endpoint: format!("http://{}", listening.addr),
                bundle_pem: String::new(),
                server_name: "ferry-control".into(),
                token: String::new(),
                cluster: "alpha".into(),
                node_id: "ferry~alpha-1".into(),
                plaintext: true,
                backoff_initial: Duration::from_millis(20),
                backoff_max: Duration::from_millis(200),
            },
            store.clone(),
        );
        let node = tokio::spawn(client.run());
        Self {
            listening,
            store,
            node,
            _shutdown: shutdown,
        }
    }

    /// Waits for the metrics to hold `line`.
    async fn metric(&self, line: &str) {
        let end = tokio::time::Instant::now() + DEADLINE;
        while !fetch(self.listening.metrics_addr, "/metrics")
            .await
            .lines()
            .any(|l| l == line)
        {
            assert!(
                tokio::time::Instant::now() < end,
                "no metric line {line}: {}",
                fetch(self.listening.metrics_addr, "/metrics")
                    .await
                    .lines()
                    .filter(|l| l.contains("kubernetes"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_clusters_follow_the_remote_secrets_in_the_local_cluster() {
    let alpha = ApiServer::start(&[&fixture("alpha")]).await;
    let beta = ApiServer::start(&[&fixture("beta")]).await;
    let dir =
        Dir(std::env::temp_dir().join(format!("ferry-k8s-control-secrets-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let local = dir.0.join("kubeconfig");
    std::fs::write(&local, kubeconfig(&alpha, "alpha")).unwrap();
    let plane = Plane::start(
        KubeSource {
            cluster_id: "alpha".into(),
            network: None,
            kubeconfig: Some(local),
            remote_secrets: vec![],
            remote_secrets_namespace: Some("istio-system".into()),
            lease: None,
            mesh: ferry_k8s::MeshConfig::default(),
            initial_sync: Duration::from_secs(10),
        },
        &dir,
    )
    .await;
    eventually("alpha's pods reach the node proxy", || {
        has(&plane.store, "sleep")
    })
    .await;
    assert!(!has(&plane.store, "echo-beta"));

    let secret = |name: &str, cluster: &str, kubeconfig: &str| {
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "istio-system", "labels": {"istio/multiCluster": "true"}},
            "stringData": {cluster: kubeconfig},
        })
    };
    alpha.apply(secret(
        "istio-remote-secret-beta",
        "beta",
        &kubeconfig(&beta, "beta"),
    ));
    eventually("the remote's pods reach the node proxy", || {
        has(&plane.store, "echo-beta")
    })
    .await;
    plane
        .metric("ferry_kubernetes_cluster_reachable{cluster=\"beta\"} 1")
        .await;

    // A malformed secret is named in the metrics; the remote stays.
    alpha.apply(secret("broken", "gamma", "clusters: [not a kubeconfig"));
    plane
        .metric("ferry_kubernetes_notes{cluster=\"alpha\",object=\"Secret istio-system/broken\"} 1")
        .await;
    assert!(has(&plane.store, "echo-beta"));

    // The remote unreachable: reported, its pods still served.
    beta.stop();
    plane
        .metric("ferry_kubernetes_cluster_reachable{cluster=\"beta\"} 0")
        .await;
    assert!(
        has(&plane.store, "echo-beta"),
        "the last good state is kept"
    );

    // The secret deleted: the remote's pods leave, and so does its metric.
    alpha.delete("v1", "Secret", "istio-system/istio-remote-secret-beta");
    eventually("the remote's pods leave the node proxy", || {
        !has(&plane.store, "echo-beta") && has(&plane.store, "sleep")
    })
    .await;
    let metrics = fetch(plane.listening.metrics_addr, "/metrics").await;
    assert!(
        !metrics.contains("ferry_kubernetes_cluster_reachable{cluster=\"beta\"}"),
        "{metrics}"
    );
    drop(plane);
    alpha.stop();
}

/// Two replicas electing with a Lease of the local cluster: both serve the mesh to their node
/// proxies, one says it leads (`ferry_kubernetes_leader 1`, `/debug/kubernetes`) and writes
/// the ServiceImport; once it is gone the other takes the Lease and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_and_the_lease_holder_alone_writes() {
    let alpha = ApiServer::start(&[&fixture("alpha")]).await;
    alpha.apply(
        json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
                       "metadata": {"name": "ledger", "namespace": "default"}}),
    );
    let dir =
        Dir(std::env::temp_dir().join(format!("ferry-k8s-control-lease-{}", std::process::id())));
    let mut planes = Vec::new();
    for who in ["a", "b"] {
        let sub = dir.0.join(who);
        std::fs::create_dir_all(&sub).unwrap();
        let path = sub.join("kubeconfig");
        // Each replica's token names its writes in the server's log.
        let text =
            kubeconfig(&alpha, "alpha").replace("user: {}", &format!("user: {{token: {who}}}"));
        std::fs::write(&path, text).unwrap();
        let lease = ferry_k8s::lease::LeaseConfig::new(
            "ferry-system",
            "ferry-control",
            who,
            // Long enough that a renewal held back by a loaded machine does not lose it.
            Duration::from_secs(6),
        );
        let source = KubeSource {
            cluster_id: "alpha".into(),
            network: None,
            kubeconfig: Some(path),
            remote_secrets: vec![],
            remote_secrets_namespace: None,
            lease: Some(lease),
            mesh: ferry_k8s::MeshConfig::default(),
            initial_sync: Duration::from_secs(10),
        };
        let sub = Dir(sub);
        planes.push((who, Plane::start(source, &sub).await, sub));
    }
    for (who, plane, _) in &planes {
        eventually(&format!("{who}'s node proxy gets the mesh"), || {
            has(&plane.store, "sleep")
        })
        .await;
    }
    let holder = || {
        alpha
            .get(
                "coordination.k8s.io/v1",
                "Lease",
                "ferry-system/ferry-control",
            )
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    };
    eventually("a replica holds the Lease", || holder().is_some()).await;
    let first = holder().unwrap();
    let lead = planes.iter().position(|(w, _, _)| *w == first).unwrap();
    let other = planes[1 - lead].0;
    planes[lead].1.metric("ferry_kubernetes_leader 1").await;
    planes[1 - lead].1.metric("ferry_kubernetes_leader 0").await;
    let debug = fetch(
        planes[1 - lead].1.listening.metrics_addr,
        "/debug/kubernetes",
    )
    .await;
    let debug: serde_json::Value = serde_json::from_str(&debug).unwrap();
    assert_eq!(debug["leader"]["leading"], json!(false), "{debug}");
    assert_eq!(debug["leader"]["holder"], json!(first), "{debug}");
    eventually("the holder writes the import", || {
        alpha
            .get(
                "multicluster.x-k8s.io/v1alpha1",
                "ServiceImport",
                "default/ledger",
            )
            .is_some()
    })
    .await;
    let writers: Vec<String> = alpha
        .writes()
        .into_iter()
        .filter(|w| w.kind == "ServiceImport")
        .map(|w| w.user)
        .collect();
    assert!(
        writers.iter().all(|u| *u == first),
        "only {first} wrote: {writers:?}"
    );

    // The holder gone, the other takes over once the Lease expired, and keeps serving.
    let stopped = planes.remove(lead);
    drop(stopped);
    planes[0].1.metric("ferry_kubernetes_leader 1").await;
    assert_eq!(holder().as_deref(), Some(other));
    assert!(has(&planes[0].1.store, "sleep"));
    drop(planes);
    alpha.stop();
}

/// GET `path` from `addr` with HTTP/1.1.
async fn fetch(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}
