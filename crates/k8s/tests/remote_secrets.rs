//! Remote clusters watched through Istio's remote secrets in the local cluster, against
//! in-process API servers (`ferry_k8s::testing`) driven by the real kube-rs client over real
//! sockets: a Secret added brings its cluster's objects into the mesh, a changed kubeconfig
//! reconnects, a malformed Secret is named and harms no other, an unreachable remote keeps its
//! last objects and is reported, a deleted Secret takes its cluster's objects out.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::snapshot::Snapshot;
use ferry_k8s::Note;
use ferry_k8s::fixtures::two_clusters as fixture;
use ferry_k8s::testing::ApiServer;
use ferry_k8s::watch::{Cluster, WatchConfig, WatchStatus, run};
use serde_json::{Value, json};
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "istio-system";

fn kubeconfig(server: &ApiServer, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: {name}, cluster: {{server: 'http://{}'}}}}]\nusers: [{{name: {name}, user: {{}}}}]\ncontexts: [{{name: {name}, context: {{cluster: {name}, user: {name}}}}}]\ncurrent-context: {name}\n",
        server.addr
    )
}

/// A Secret as `istioctl create-remote-secret` writes it, with `data` (base64, as the API
/// server returns it).
fn remote_secret(name: &str, data: Value) -> Value {
    let mut secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": name, "namespace": NAMESPACE,
            "labels": {"istio/multiCluster": "true"},
            "annotations": {"networking.istio.io/cluster": name},
        },
    });
    secret["data"] = data;
    secret
}

/// `text` as a Secret's `data` holds it (base64).
fn base64(text: &str) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(text.as_bytes().to_vec())).unwrap()
}

fn pod(name: &str, node: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "echo"}, "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"nodeName": node, "serviceAccountName": "echo", "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn has(s: &Snapshot, name: &str) -> bool {
    s.workloads().any(|w| w.name == name)
}

/// The local cluster alpha, watched with its remote secrets.
struct Rig {
    alpha: Arc<ApiServer>,
    meshes: watch::Receiver<Option<(Arc<Snapshot>, Vec<Note>)>>,
    status: watch::Receiver<WatchStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.task.abort();
        self.alpha.stop();
    }
}

impl Rig {
    async fn start() -> Self {
        let alpha = ApiServer::start(&[&fixture("alpha")]).await;
        let clusters = vec![Cluster {
            id: "alpha".into(),
            network: None,
            client: alpha.client(),
        }];
        let config = WatchConfig {
            remote_secrets: Some(NAMESPACE.into()),
            ..WatchConfig::default()
        };
        let (mesh_tx, meshes) = watch::channel(None);
        let (status_tx, status) = watch::channel(WatchStatus::default());
        let task = tokio::spawn(run(clusters, config, status_tx, move |o| {
            if let Ok(ferry_k8s::watch::Mesh {
                topology: t,
                notes: n,
                ..
            }) = o
            {
                mesh_tx.send_replace(Some((Arc::new(t.snapshot), n)));
            }
        }));
        Self {
            alpha,
            meshes,
            status,
            task,
        }
    }

    /// Waits (on change events, within the deadline) for a mesh and its notes that satisfy
    /// `what`.
    async fn until(
        &mut self,
        why: &str,
        what: impl Fn(&Snapshot, &[Note]) -> bool,
    ) -> Arc<Snapshot> {
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some((s, n)) = self.meshes.borrow_and_update().clone()
                    && what(&s, &n)
                {
                    return s;
                }
                self.meshes.changed().await.expect("the watch runs");
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no mesh where {why} within {DEADLINE:?}"))
    }

    /// Waits for a status that satisfies `what`.
    async fn status_until(&mut self, why: &str, what: impl Fn(&WatchStatus) -> bool) {
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                if what(&self.status.borrow_and_update()) {
                    return;
                }
                self.status.changed().await.expect("the watch runs");
            }
        })
        .await;
        assert!(found.is_ok(), "no status where {why} within {DEADLINE:?}");
    }
}

fn note_on<'n>(notes: &'n [Note], object: &str) -> Option<&'n Note> {
    notes.iter().find(|n| n.object == object)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_clusters_come_and_go_with_their_secrets() {
    let mut r = Rig::start().await;
    let beta = ApiServer::start(&[&fixture("beta")]).await;
    r.until("alpha alone is in", |s, _| {
        has(s, "sleep") && !has(s, "echo-beta")
    })
    .await;

    // A remote secret added: beta's objects join the mesh.
    r.alpha.apply(remote_secret(
        "istio-remote-secret-beta",
        json!({"beta": base64(&kubeconfig(&beta, "beta"))}),
    ));
    r.until("beta's pods are in", |s, _| {
        has(s, "echo-beta") && has(s, "ledger-beta")
    })
    .await;
    r.status_until("beta is read by its secret", |s| {
        s.clusters.get("beta").and_then(|c| c.secret.as_deref())
            == Some("istio-system/istio-remote-secret-beta")
            && s.remote_secrets["istio-system/istio-remote-secret-beta"].clusters == ["beta"]
    })
    .await;

    // Malformed secrets are each named with what is wrong; beta stays.
    r.alpha.apply(remote_secret(
        "bad-base64",
        json!({"gamma": "%%% not base64"}),
    ));
    r.alpha.apply(remote_secret(
        "bad-kubeconfig",
        json!({"delta": base64("clusters: [this is not a kubeconfig")}),
    ));
    r.alpha.apply(remote_secret(
        "runs-a-command",
        json!({"epsilon": base64("apiVersion: v1\nkind: Config\nclusters: [{name: e, cluster: {server: 'http://127.0.0.1:9'}}]\nusers: [{name: e, user: {exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}}}]\ncontexts: [{name: e, context: {cluster: e, user: e}}]\ncurrent-context: e\n")}),
    ));
    r.alpha.apply(remote_secret(
        "claims-the-local-cluster",
        json!({"alpha": base64(&kubeconfig(&beta, "alpha"))}),
    ));
    let s = r
        .until("every bad secret is noted", |_, n| {
            [
                "Secret istio-system/bad-base64",
                "Secret istio-system/bad-kubeconfig",
                "Secret istio-system/runs-a-command",
                "Secret istio-system/claims-the-local-cluster",
            ]
            .iter()
            .all(|o| note_on(n, o).is_some())
        })
        .await;
    assert!(has(&s, "echo-beta"), "bad secrets harm no other");
    let notes = r.meshes.borrow().clone().unwrap().1;
    let says = |object: &str, what: &str| {
        let n = note_on(&notes, object).unwrap();
        assert_eq!(n.cluster, "alpha");
        assert!(n.message.contains(what), "{object}: {}", n.message);
    };
    says("Secret istio-system/bad-base64", "not a Secret");
    says(
        "Secret istio-system/bad-kubeconfig",
        "cluster delta's kubeconfig",
    );
    says(
        "Secret istio-system/runs-a-command",
        "runs a command or an auth provider",
    );
    says(
        "Secret istio-system/claims-the-local-cluster",
        "cluster alpha is read already",
    );
    let status = r.status.borrow().clone();
    assert!(
        status.remote_secrets["istio-system/bad-base64"]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("not a Secret")),
        "{status:?}"
    );

    // The secret changed to another server for beta: reconnected, its objects are read.
    let beta2 = ApiServer::start(&[&fixture("beta")]).await;
    beta2.apply(pod("echo-beta-9", "beta-1", "198.18.3.99"));
    r.alpha.edit(
        "v1",
        "Secret",
        "istio-system/istio-remote-secret-beta",
        |s| {
            s["data"]["beta"] = base64(&kubeconfig(&beta2, "beta"));
        },
    );
    r.until("the new server's pod is in", |s, _| {
        has(s, "echo-beta-9") && has(s, "echo-beta")
    })
    .await;
    // The old connection is gone: a change on the old server no longer reaches the mesh.
    beta.apply(pod("only-on-the-old-server", "beta-1", "198.18.3.98"));
    beta2.apply(pod("echo-beta-10", "beta-1", "198.18.3.100"));
    let s = r
        .until("the new server's second pod is in", |s, _| {
            has(s, "echo-beta-10")
        })
        .await;
    assert!(
        !has(&s, "only-on-the-old-server"),
        "the old watch was stopped"
    );
    beta.stop();

    // The remote becomes unreachable: its last objects stay, and it is reported.
    beta2.stop();
    r.status_until("beta is reported unreachable", |s| {
        s.clusters
            .get("beta")
            .is_some_and(|c| c.last_error.is_some())
    })
    .await;
    r.alpha
        .apply(pod("while-beta-is-away", "alpha-1", "198.18.1.34"));
    let s = r
        .until("alpha's change is in", |s, _| has(s, "while-beta-is-away"))
        .await;
    assert!(
        has(&s, "echo-beta-9"),
        "an unreachable remote keeps its last objects"
    );

    // The secret deleted: beta's objects leave the mesh, and it is no longer listed.
    r.alpha
        .delete("v1", "Secret", "istio-system/istio-remote-secret-beta");
    r.until("beta's objects are gone", |s, _| {
        !has(s, "echo-beta-9") && !has(s, "echo-beta") && has(s, "sleep")
    })
    .await;
    r.status_until("beta is no longer watched", |s| {
        !s.clusters.contains_key("beta")
            && !s
                .remote_secrets
                .contains_key("istio-system/istio-remote-secret-beta")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_elsewhere_or_unlabelled_is_not_read() {
    let mut r = Rig::start().await;
    let beta = ApiServer::start(&[&fixture("beta")]).await;
    let mut other_ns = remote_secret(
        "in-default",
        json!({"beta": base64(&kubeconfig(&beta, "beta"))}),
    );
    other_ns["metadata"]["namespace"] = json!("default");
    r.alpha.apply(other_ns);
    let mut unlabelled = remote_secret(
        "unlabelled",
        json!({"beta": base64(&kubeconfig(&beta, "beta"))}),
    );
    unlabelled["metadata"]["labels"] = json!({});
    r.alpha.apply(unlabelled);
    // A remote secret where they are looked for, after them in the same watch: once its
    // cluster is in, those two were passed over.
    r.alpha.apply(remote_secret(
        "istio-remote-secret-beta",
        json!({"beta": base64(&kubeconfig(&beta, "beta"))}),
    ));
    r.until("beta is in", |s, _| has(s, "echo-beta")).await;
    let secrets: Vec<String> = r.status.borrow().remote_secrets.keys().cloned().collect();
    assert_eq!(secrets, ["istio-system/istio-remote-secret-beta"]);
    beta.stop();
}
