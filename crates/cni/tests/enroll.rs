//! The node agent enrolls pods as Istio's labels say, read from an API server over real HTTP
//! (ferry-k8s's in-process list/watch server: no Kubernetes runs here) with the real kube-rs
//! client, and hands them over real ZDS (SOCK_SEQPACKET, the pod's network namespace in
//! SCM_RIGHTS) to a node proxy played by the test, which records what it is sent and acks it.
//! The pods' namespace is the test process's own (`/proc/self/ns/net`), so no root is needed and
//! the test checks that the descriptor it receives is that namespace.

use std::collections::BTreeSet;
use std::io::IoSliceMut;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::zds::{
    Ack, Version, WorkloadRequest, WorkloadResponse, ZdsHello, workload_request::Payload,
    workload_response,
};
use ferry_cni::agent::{Config, KubeStatus, Kubernetes};
use ferry_cni::spec::PodRef;
use ferry_cni::wire::{Answer, Ask};
use ferry_k8s::testing::ApiServer;
use prost::Message;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio_seqpacket::UnixSeqpacket;
use tokio_seqpacket::ancillary::OwnedAncillaryMessage;

const DEADLINE: Duration = Duration::from_secs(15);
const NETNS: &str = "/proc/self/ns/net";
const NODE: &str = "node-1";

const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}
- apiVersion: v1
  kind: Namespace
  metadata: {name: plain}
- apiVersion: v1
  kind: Pod
  metadata: {name: web, namespace: shop, uid: u-web, labels: {app: web}}
  spec: {nodeName: node-1, containers: [{name: web, image: web}]}
  status: {phase: Running}
- apiVersion: v1
  kind: Pod
  metadata: {name: legacy, namespace: shop, uid: u-legacy, labels: {istio.io/dataplane-mode: none}}
  spec: {nodeName: node-1, containers: [{name: legacy, image: legacy}]}
  status: {phase: Running}
- apiVersion: v1
  kind: Pod
  metadata: {name: db, namespace: plain, uid: u-db}
  spec: {nodeName: node-1, containers: [{name: db, image: db}]}
  status: {phase: Running}
- apiVersion: v1
  kind: Pod
  metadata: {name: far, namespace: shop, uid: u-far}
  spec: {nodeName: node-2, containers: [{name: far, image: far}]}
  status: {phase: Running}
"#;

/// What the node proxy played by the test was sent, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sent {
    /// A pod, and whether the descriptor with it is the test's network namespace.
    Add {
        uid: String,
        our_netns: bool,
    },
    Del {
        uid: String,
    },
    /// `snapshot_sent`: the replay is over.
    ReplayEnd,
}

/// The agent, its API server and its node proxy; the agent's task ends with it.
struct World {
    dir: PathBuf,
    api: Arc<ApiServer>,
    status: watch::Receiver<KubeStatus>,
    sent: watch::Receiver<Vec<Sent>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for World {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.api.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    async fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ferry-cni-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let api = ApiServer::start(&[CLUSTER]).await;
        let mut kubernetes = Kubernetes::new(api.client(), NODE);
        kubernetes.pod_wait = DEADLINE;
        let status = kubernetes.status();
        let config = Config {
            plugin_socket: dir.join("cni.sock"),
            zds_socket: dir.join("zds.sock"),
            namespaces: BTreeSet::new(),
            all_namespaces: false,
            excluded: BTreeSet::new(),
            state_file: dir.join("pods.json"),
            kubernetes: Some(kubernetes),
            proc_dir: "/proc".into(),
        };
        let agent = tokio::spawn(async move {
            if let Err(e) = ferry_cni::agent::run(config).await {
                panic!("the agent stopped: {e:#}");
            }
        });
        let (tx, sent) = watch::channel(Vec::new());
        let node = tokio::spawn(node_proxy(dir.join("zds.sock"), tx));
        let w = Self {
            dir,
            api,
            status,
            sent,
            tasks: vec![agent, node],
        };
        w.until("the replay ended", |w| w.sent().contains(&Sent::ReplayEnd))
            .await;
        w.until("the watch listed", |w| w.status.borrow().synced)
            .await;
        w
    }

    fn sent(&self) -> Vec<Sent> {
        self.sent.borrow().clone()
    }

    /// Polls `f` until it holds, failing the test at the deadline.
    async fn until(&self, what: &str, f: impl Fn(&Self) -> bool) {
        let end = tokio::time::Instant::now() + DEADLINE;
        while !f(self) {
            assert!(
                tokio::time::Instant::now() < end,
                "{what}: not within {DEADLINE:?}; node proxy saw {:?}; watch {:?}",
                self.sent(),
                *self.status.borrow()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asks the agent what the plugin asks when the runtime adds pod `ns/name`.
    async fn add(&self, ns: &str, name: &str) -> Answer {
        let ask = Ask::Add {
            pod: PodRef {
                namespace: ns.into(),
                name: name.into(),
                uid: format!("u-{name}"),
            },
            container_id: format!("ctr-{name}"),
            netns: NETNS.into(),
            uncaptured: Vec::new(),
        };
        let conn = tokio::net::UnixStream::connect(self.dir.join("cni.sock"))
            .await
            .unwrap();
        let (read, mut write) = conn.into_split();
        let mut line = serde_json::to_string(&ask).unwrap();
        line.push('\n');
        write.write_all(line.as_bytes()).await.unwrap();
        let mut answer = String::new();
        BufReader::new(read).read_line(&mut answer).await.unwrap();
        serde_json::from_str(&answer).unwrap()
    }

    fn pod(&self, ns: &str, name: &str) -> Value {
        self.api
            .get("v1", "Pod", &format!("{ns}/{name}"))
            .expect("the pod")
    }

    fn redirection(&self, ns: &str, name: &str) -> Option<String> {
        self.pod(ns, name)["metadata"]["annotations"]["ambient.istio.io/redirection"]
            .as_str()
            .map(str::to_string)
    }

    fn labels(&self, kind: &str, key: &str, labels: Value) {
        self.api.edit("v1", kind, key, |o| {
            o["metadata"]["labels"] = labels;
        });
    }
}

/// The node proxy: connects, says hello, records and acks every request.
async fn node_proxy(socket: PathBuf, sent: watch::Sender<Vec<Sent>>) {
    let conn = loop {
        match UnixSeqpacket::connect(&socket).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let hello = ZdsHello {
        version: Version::V1 as i32,
    };
    conn.send(&hello.encode_to_vec()).await.unwrap();
    let ours = std::fs::metadata(NETNS).unwrap().ino();
    loop {
        let mut buf = vec![0u8; 4096];
        let mut space = [0u8; 256];
        let Ok((n, reader)) = conn
            .recv_vectored_with_ancillary(&mut [IoSliceMut::new(&mut buf)], &mut space)
            .await
        else {
            return;
        };
        if n == 0 {
            return;
        }
        let mut fds = Vec::new();
        for m in reader.into_messages() {
            if let OwnedAncillaryMessage::FileDescriptors(owned) = m {
                fds.extend(owned);
            }
        }
        let request = WorkloadRequest::decode(&buf[..n]).expect("a WorkloadRequest");
        let event = match request.payload.expect("a payload") {
            Payload::Add(a) => {
                let netns = std::fs::File::from(fds.pop().expect("a descriptor with the add"));
                Sent::Add {
                    uid: a.uid,
                    our_netns: netns.metadata().unwrap().ino() == ours,
                }
            }
            Payload::Del(d) => Sent::Del { uid: d.uid },
            Payload::SnapshotSent(_) => Sent::ReplayEnd,
            other => panic!("unexpected {other:?}"),
        };
        sent.send_modify(|s| s.push(event));
        let ack = WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack {
                error: String::new(),
            })),
        };
        conn.send(&ack.encode_to_vec()).await.unwrap();
    }
}

fn add(uid: &str) -> Sent {
    Sent::Add {
        uid: uid.into(),
        our_netns: true,
    }
}

fn del(uid: &str) -> Sent {
    Sent::Del { uid: uid.into() }
}

#[tokio::test]
async fn a_namespace_labelled_ambient_sends_its_pod_over_zds_and_annotates_it() {
    let w = World::start("labelled").await;
    assert_eq!(
        w.status.borrow().pods,
        3,
        "only this node's pods are watched (field selector spec.nodeName)"
    );
    let answer = w.add("shop", "web").await;
    assert_eq!(answer.error, "");
    assert!(answer.enrolled, "{answer:?}");
    assert_eq!(w.sent(), vec![Sent::ReplayEnd, add("u-web")]);
    w.until("web annotated", |w| {
        w.redirection("shop", "web").as_deref() == Some("enabled")
    })
    .await;
    let patch = w.api.patch_log().remove(0);
    assert_eq!(patch.path, "/api/v1/namespaces/shop/pods/web/status");
    assert_eq!(patch.content_type, "application/merge-patch+json");
    assert_eq!(
        patch.body,
        json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}})
    );
}

#[tokio::test]
async fn a_pod_labelled_none_is_not_sent_over_zds_nor_annotated() {
    let w = World::start("opted-out").await;
    let answer = w.add("shop", "legacy").await;
    assert_eq!(answer, Answer::default(), "left alone, without an error");
    // The next pod is the first one the node proxy is sent.
    assert!(w.add("shop", "web").await.enrolled);
    assert_eq!(w.sent(), vec![Sent::ReplayEnd, add("u-web")]);
    w.until("web annotated", |w| w.redirection("shop", "web").is_some())
        .await;
    assert_eq!(w.redirection("shop", "legacy"), None);
    assert!(
        w.api.patch_log().iter().all(|p| !p.path.contains("legacy")),
        "{:?}",
        w.api.patch_log()
    );
}

#[tokio::test]
async fn removing_the_namespace_label_removes_its_running_pod_and_clears_the_annotation() {
    let w = World::start("unlabelled").await;
    assert!(w.add("shop", "web").await.enrolled);
    w.until("web annotated", |w| w.redirection("shop", "web").is_some())
        .await;
    w.labels("Namespace", "/shop", json!({}));
    w.until("web removed over ZDS", |w| w.sent().contains(&del("u-web")))
        .await;
    w.until("web's annotation cleared", |w| {
        w.redirection("shop", "web").is_none()
    })
    .await;
    let log = w.api.patch_log();
    assert_eq!(
        log.last().unwrap().body,
        json!({"metadata": {"annotations": {"ambient.istio.io/redirection": null}}})
    );
    // Labelled again, the running pod is handed over again, from the namespace the plugin named.
    w.labels(
        "Namespace",
        "/shop",
        json!({"istio.io/dataplane-mode": "ambient"}),
    );
    w.until("web added again", |w| {
        w.sent().iter().filter(|s| **s == add("u-web")).count() == 2
    })
    .await;
    w.until("web annotated again", |w| {
        w.redirection("shop", "web").is_some()
    })
    .await;
}

#[tokio::test]
async fn a_running_pod_is_enrolled_when_its_namespace_is_labelled_and_released_when_it_ends() {
    let w = World::start("running").await;
    assert_eq!(w.add("plain", "db").await, Answer::default());
    w.labels(
        "Namespace",
        "/plain",
        json!({"istio.io/dataplane-mode": "ambient"}),
    );
    w.until("db added over ZDS", |w| w.sent().contains(&add("u-db")))
        .await;
    w.until("db annotated", |w| {
        w.redirection("plain", "db").as_deref() == Some("enabled")
    })
    .await;
    w.api.edit("v1", "Pod", "plain/db", |o| {
        o["status"]["phase"] = json!("Succeeded");
    });
    w.until("db released when it ended", |w| {
        w.sent().contains(&del("u-db"))
    })
    .await;
    w.until("db's annotation cleared", |w| {
        w.redirection("plain", "db").is_none()
    })
    .await;
}

#[tokio::test]
async fn a_malformed_object_is_a_clear_error_and_the_last_good_state_is_kept() {
    let w = World::start("malformed").await;
    assert!(w.add("shop", "web").await.enrolled);
    assert_eq!(w.add("plain", "db").await, Answer::default());
    w.until("web annotated", |w| w.redirection("shop", "web").is_some())
        .await;
    // A pod whose spec does not decode: named with its field, and what was known of it stays.
    w.api.edit("v1", "Pod", "shop/web", |o| {
        o["spec"]["hostNetwork"] = json!("yes");
    });
    w.until("the malformed pod reported", |w| {
        w.status.borrow().malformed == 1
    })
    .await;
    let error = w.status.borrow().last_error.clone().unwrap();
    assert!(
        error.starts_with("Pod shop/web: spec.hostNetwork: invalid type: string \"yes\""),
        "{error}"
    );
    // A namespace whose labels are not a map: its event fails; the namespace stays as it was.
    w.api.edit("v1", "Namespace", "/shop", |o| {
        o["metadata"]["labels"] = json!("ambient");
    });
    w.until("the malformed namespace reported", |w| {
        w.status.borrow().malformed == 2
    })
    .await;
    let error = w.status.borrow().last_error.clone().unwrap();
    assert!(error.starts_with("a malformed Namespace: "), "{error}");
    // A later change is carried out on the last good state: web is still enrolled.
    w.labels(
        "Pod",
        "plain/db",
        json!({"istio.io/dataplane-mode": "ambient"}),
    );
    w.until("db added over ZDS", |w| w.sent().contains(&add("u-db")))
        .await;
    assert_eq!(
        w.sent(),
        vec![Sent::ReplayEnd, add("u-web"), add("u-db")],
        "web was never removed"
    );
    assert_eq!(w.redirection("shop", "web").as_deref(), Some("enabled"));
}
