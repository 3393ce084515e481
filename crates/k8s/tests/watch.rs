//! The watch layer against an in-process API server (tests/support/apiserver.rs) driven by the
//! real kube-rs client over a real socket: every kind's add, change and delete reaches the
//! translated mesh; a dropped watch, a 410 Gone and refused requests lose and duplicate
//! nothing; an unreachable cluster keeps its last good state.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::model::{Health, ScopeRule, ServiceKey, TunnelProtocol};
use ferry_core::snapshot::Snapshot;
use ferry_k8s::fixtures::two_clusters as fixture;
use ferry_k8s::testing::ApiServer;
use ferry_k8s::watch::{Cluster, WatchConfig, WatchStatus, run};
use serde_json::json;
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);

/// Two fake clusters and a watch over both; the latest translated mesh in `meshes`.
struct Rig {
    alpha: Arc<ApiServer>,
    beta: Arc<ApiServer>,
    meshes: watch::Receiver<Option<Arc<Snapshot>>>,
    /// The notes of the latest mesh (sent before it).
    notes: watch::Receiver<Vec<ferry_k8s::Note>>,
    /// The workloads the latest mesh changed, when it was an edit of pods (sent before it).
    edits: watch::Receiver<Option<Vec<String>>>,
    status: watch::Receiver<WatchStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.task.abort();
        self.alpha.stop();
        self.beta.stop();
    }
}

async fn rig() -> Rig {
    rig_with(WatchConfig::default(), |_, _| {}).await
}

/// A rig whose watch runs with `config`, after `prepare` has set up the two servers.
async fn rig_with(config: WatchConfig, prepare: impl FnOnce(&ApiServer, &ApiServer)) -> Rig {
    let alpha = ApiServer::start(&[&fixture("alpha")]).await;
    let beta = ApiServer::start(&[&fixture("beta")]).await;
    prepare(&alpha, &beta);
    let clusters = vec![
        Cluster {
            id: "alpha".into(),
            network: None,
            client: alpha.client(),
        },
        Cluster {
            id: "beta".into(),
            network: None,
            client: beta.client(),
        },
    ];
    let (mesh_tx, meshes) = watch::channel(None);
    let (notes_tx, notes) = watch::channel(Vec::new());
    let (edits_tx, edits) = watch::channel(None);
    let (status_tx, status) = watch::channel(WatchStatus::default());
    let task = tokio::spawn(run(clusters, config, status_tx, move |o| {
        if let Ok(ferry_k8s::watch::Mesh {
            topology: t,
            notes: n,
            edit,
        }) = o
        {
            notes_tx.send_replace(n);
            edits_tx.send_replace(
                edit.map(|e| e.workloads.iter().map(|u| u.as_str().to_string()).collect()),
            );
            mesh_tx.send_replace(Some(Arc::new(t.snapshot)));
        }
    }));
    Rig {
        alpha,
        beta,
        meshes,
        notes,
        edits,
        status,
        task,
    }
}

impl Rig {
    /// Waits (on change events, within the deadline) for a mesh that satisfies `what`.
    async fn until(&mut self, why: &str, what: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some(s) = self.meshes.borrow_and_update().clone()
                    && what(&s)
                {
                    return s;
                }
                self.meshes.changed().await.expect("the watch runs");
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no mesh where {why} within {DEADLINE:?}"))
    }
}

fn has(s: &Snapshot, name: &str) -> bool {
    s.workloads().any(|w| w.name == name)
}

fn workload<'s>(s: &'s Snapshot, name: &str) -> &'s ferry_core::model::Workload {
    s.workloads().find(|w| w.name == name).unwrap()
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", format!("{name}.default.svc.cluster.local"))
}

fn pod(name: &str, node: &str, ip: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "echo"}, "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"nodeName": node, "serviceAccountName": "echo", "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_of_every_kind_reach_the_mesh() {
    let mut r = rig().await;
    r.until("both clusters are in", |s| {
        has(s, "sleep") && has(s, "echo-beta")
    })
    .await;

    // Pod: add, change, delete.
    r.alpha.apply(pod("echo-alpha-3", "alpha-1", "198.18.1.30"));
    r.until("the new pod is in", |s| has(s, "echo-alpha-3"))
        .await;
    r.alpha.edit("v1", "Pod", "default/echo-alpha-3", |p| {
        p["status"]["conditions"][0]["status"] = json!("False");
    });
    r.until("the pod is unhealthy", |s| {
        has(s, "echo-alpha-3") && workload(s, "echo-alpha-3").health == Health::Unhealthy
    })
    .await;
    r.alpha.delete("v1", "Pod", "default/echo-alpha-3");
    r.until("the pod is gone", |s| !has(s, "echo-alpha-3"))
        .await;

    // Service: add, change, delete.
    r.beta.apply_yaml(
        "apiVersion: v1\nkind: Service\nmetadata: {name: extra, namespace: default}\nspec: {clusterIP: 198.18.11.9, ports: [{port: 80, targetPort: 8080}], selector: {app: echo}}\n",
    );
    r.until("the new service is in", |s| {
        s.service(&key("extra")).is_some()
    })
    .await;
    r.beta.edit("v1", "Service", "default/extra", |s| {
        s["metadata"]["labels"] = json!({"istio.io/global": "true"});
    });
    r.until("the service is global", |s| {
        s.service(&key("extra"))
            .is_some_and(|x| x.scope.by_cluster.get(&"beta".into()) == Some(&ScopeRule::Global))
    })
    .await;
    r.beta.delete("v1", "Service", "default/extra");
    r.until("the service is gone", |s| {
        s.service(&key("extra")).is_none()
    })
    .await;

    // Namespace: leaving ambient makes alpha's pods plain TCP.
    r.alpha.edit("v1", "Namespace", "/default", |n| {
        n["metadata"]["labels"] = json!({});
    });
    r.until("sleep is out of the mesh", |s| {
        workload(s, "sleep").tunnel == TunnelProtocol::Tcp
    })
    .await;

    // Node: a new node takes pods.
    r.alpha.apply_yaml(
        "apiVersion: v1\nkind: Node\nmetadata: {name: alpha-3, labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: z3}}\n",
    );
    r.alpha.apply(pod("echo-alpha-4", "alpha-3", "198.18.4.10"));
    r.until("the pod on the new node is in", |s| {
        has(s, "echo-alpha-4")
            && workload(s, "echo-alpha-4")
                .node
                .as_ref()
                .map(|n| n.as_str())
                == Some("alpha-3")
    })
    .await;

    // Gateway: removing the waypoint from both clusters detaches audit.
    r.until("audit has its waypoint", |s| {
        s.service(&key("audit"))
            .is_some_and(|a| a.waypoint.is_some())
    })
    .await;
    r.alpha.delete(
        "gateway.networking.k8s.io/v1",
        "Gateway",
        "default/audit-waypoint",
    );
    r.beta.delete(
        "gateway.networking.k8s.io/v1",
        "Gateway",
        "default/audit-waypoint",
    );
    r.until("audit has no waypoint", |s| {
        s.service(&key("audit"))
            .is_some_and(|a| a.waypoint.is_none())
    })
    .await;

    // AuthorizationPolicy: a new one is in the mesh; deleted, it is gone.
    r.beta.apply_yaml(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny-all-echo, namespace: default}\nspec: {selector: {matchLabels: {app: echo}}, action: DENY, rules: [{}]}\n",
    );
    r.until("the policy is in", |s| {
        s.policies().any(|p| p.name == "deny-all-echo")
    })
    .await;
    r.beta.delete(
        "security.istio.io/v1",
        "AuthorizationPolicy",
        "default/deny-all-echo",
    );
    r.until("the policy is gone", |s| {
        !s.policies().any(|p| p.name == "deny-all-echo")
    })
    .await;
}

/// An edit of pods and slices reaches the mesh as a delta of the workloads it touches; a
/// Service's change is translated whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_and_slice_events_are_applied_as_workload_edits() {
    let mut r = rig().await;
    r.until("both clusters are in", |s| {
        has(s, "sleep") && has(s, "echo-beta")
    })
    .await;
    let uid = |name: &str| format!("alpha//v1/Pod/default/{name}");
    r.alpha.apply(pod("echo-alpha-9", "alpha-1", "198.18.1.39"));
    r.until("the new pod is in", |s| has(s, "echo-alpha-9"))
        .await;
    assert_eq!(
        *r.edits.borrow(),
        Some(vec![uid("echo-alpha-9")]),
        "a pod added is an edit of its workload"
    );
    r.alpha.apply(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-q9", "namespace": "default", "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["198.18.1.39"], "conditions": {"serving": false},
                       "targetRef": {"kind": "Pod", "namespace": "default", "name": "echo-alpha-9"}}],
    }));
    r.until("the slice marks the pod unhealthy", |s| {
        workload(s, "echo-alpha-9").health == Health::Unhealthy
    })
    .await;
    assert_eq!(
        *r.edits.borrow(),
        Some(vec![uid("echo-alpha-9")]),
        "a slice's change is an edit of the pods it names"
    );
    r.alpha.delete("v1", "Pod", "default/echo-alpha-9");
    r.until("the pod is gone", |s| !has(s, "echo-alpha-9"))
        .await;
    assert_eq!(*r.edits.borrow(), Some(vec![uid("echo-alpha-9")]));
    r.alpha.edit("v1", "Service", "default/ledger", |svc| {
        svc["spec"]["ports"][0]["port"] = json!(81);
    });
    r.until("the service's port changed", |s| {
        s.service(&key("ledger"))
            .is_some_and(|svc| svc.ports.iter().any(|p| p.port == 81))
    })
    .await;
    assert_eq!(
        *r.edits.borrow(),
        None,
        "a Service's change is translated whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_slice_update_marking_a_pod_terminating_reaches_the_mesh() {
    let mut r = rig().await;
    r.until("both clusters are in", |s| {
        has(s, "sleep") && has(s, "echo-beta")
    })
    .await;
    let endpoint = |pod: &str, ip: &str, conditions: serde_json::Value| {
        json!({"addresses": [ip], "conditions": conditions,
               "targetRef": {"kind": "Pod", "namespace": "default", "name": pod, "uid": format!("0000-{pod}")}})
    };
    r.alpha.apply(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-x7k2p", "namespace": "default", "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "endpoints": [
            endpoint("echo-alpha-1", "198.18.1.20", json!({"ready": true, "serving": true, "terminating": false})),
            endpoint("echo-alpha-2", "198.18.2.20", json!({"ready": false, "serving": false, "terminating": false})),
        ],
    }));
    r.until("the slice is in: echo-alpha-2 is not serving", |s| {
        workload(s, "echo-alpha-2").health == Health::Unhealthy
    })
    .await;
    assert_eq!(
        workload(&r.meshes.borrow().clone().unwrap(), "echo-alpha-1").health,
        Health::Healthy
    );
    // The pod is being deleted: the controller marks its endpoint terminating, still serving.
    r.alpha.edit(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        "default/echo-x7k2p",
        |s| {
            s["endpoints"][0]["conditions"] =
                json!({"ready": false, "serving": true, "terminating": true});
        },
    );
    r.until("echo-alpha-1 is terminating", |s| {
        workload(s, "echo-alpha-1").health == Health::Terminating
    })
    .await;
    let pod = r.alpha.get("v1", "Pod", "default/echo-alpha-1").unwrap();
    assert_eq!(
        pod["status"]["conditions"][0],
        json!({"type": "Ready", "status": "True"}),
        "the pod's own Ready is unchanged"
    );
    // The slice gone, each pod's own Ready decides again.
    r.alpha
        .delete("discovery.k8s.io/v1", "EndpointSlice", "default/echo-x7k2p");
    r.until("both pods are healthy again", |s| {
        workload(s, "echo-alpha-1").health == Health::Healthy
            && workload(s, "echo-alpha-2").health == Health::Healthy
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_gone_and_refusals_lose_and_duplicate_nothing() {
    let mut r = rig().await;
    let first = r
        .until("both clusters are in", |s| {
            has(s, "sleep") && has(s, "echo-beta")
        })
        .await;
    let count = first.workloads().count();

    // A dropped watch resumes from its last resourceVersion.
    r.alpha.drop_watches();
    r.alpha.apply(pod("after-drop", "alpha-1", "198.18.1.31"));
    r.until("the pod added after the drop is in", |s| {
        has(s, "after-drop")
    })
    .await;

    // History compacted, then the watch dropped: resuming gets 410 Gone and relists. A pod
    // deleted and one added meanwhile are both seen.
    let lists = r.alpha.lists();
    r.alpha.compact();
    r.alpha.drop_watches();
    r.alpha.delete("v1", "Pod", "default/after-drop");
    r.alpha.apply(pod("after-gone", "alpha-1", "198.18.1.32"));
    let s = r
        .until("the relist is in", |s| {
            has(s, "after-gone") && !has(s, "after-drop")
        })
        .await;
    assert_eq!(
        s.workloads().count(),
        count + 1,
        "nothing lost or duplicated"
    );
    // Resumed watches were answered 410 Gone, and the watcher listed again (after its
    // backoff, so polled for).
    let relisted = tokio::time::timeout(DEADLINE, async {
        while !(r.alpha.gone() >= 1 && r.alpha.lists() > lists) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        relisted.is_ok(),
        "410 Gone and a relist: {lists} then {} lists, {} gone",
        r.alpha.lists(),
        r.alpha.gone()
    );

    // Refused requests (429, 500) are retried.
    r.alpha.refuse_next("v1", "Pod", &[429, 500, 503]);
    r.alpha.drop_watches();
    r.alpha
        .apply(pod("after-refusals", "alpha-1", "198.18.1.33"));
    let s = r
        .until("the pod added after the refusals is in", |s| {
            has(s, "after-refusals")
        })
        .await;
    assert_eq!(s.workloads().count(), count + 2);
    // The pod watcher can only have seen it after its three refused requests.
    assert_eq!(
        r.alpha.refusals_left(),
        0,
        "every refusal was met and retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_keeps_its_last_good_state() {
    let mut r = rig().await;
    r.until("both clusters are in", |s| {
        has(s, "sleep") && has(s, "echo-beta")
    })
    .await;
    r.beta.stop();
    // A change in alpha makes a new mesh: beta's objects are still in it.
    r.alpha
        .apply(pod("while-beta-is-away", "alpha-1", "198.18.1.34"));
    let s = r
        .until("alpha's change is in", |s| has(s, "while-beta-is-away"))
        .await;
    assert!(
        has(&s, "echo-beta") && has(&s, "ledger-beta"),
        "beta is not wiped"
    );
    // And beta is reported.
    let reported = tokio::time::timeout(DEADLINE, async {
        loop {
            if r.status.borrow_and_update().clusters["beta"]
                .last_error
                .is_some()
            {
                return;
            }
            r.status.changed().await.unwrap();
        }
    })
    .await;
    assert!(reported.is_ok(), "the unreachable cluster is reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_not_installed_is_empty_and_a_kind_never_listed_keeps_its_cluster_out() {
    let config = WatchConfig {
        initial_sync: Duration::from_secs(2),
        ..WatchConfig::default()
    };
    // alpha has no AuthorizationPolicy CRD (404); beta forbids listing them (403), for good.
    let mut r = rig_with(config, |alpha, beta| {
        alpha.refuse_next(
            "security.istio.io/v1",
            "AuthorizationPolicy",
            &[404; 10_000],
        );
        beta.refuse_next(
            "security.istio.io/v1",
            "AuthorizationPolicy",
            &[403; 10_000],
        );
    })
    .await;
    // alpha is served once it has listed every kind (its missing kind is empty); a first mesh
    // built at the initial sync's end may come before that on a loaded machine.
    let snap = r.until("alpha is served", |s| has(s, "sleep")).await;
    let notes = r.notes.borrow().clone();
    assert!(
        !has(&snap, "echo-beta"),
        "beta is not served without its policies"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.cluster == "beta" && n.message.contains("not every kind has listed")),
        "{notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_between_exports_is_written_to_the_export_and_cleared_when_it_ends() {
    let mut r = rig().await;
    r.until("both clusters are in", |s| {
        has(s, "sleep") && has(s, "echo-beta")
    })
    .await;
    let export = |name: &str| {
        json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
               "metadata": {"name": name, "namespace": "default"}})
    };
    r.alpha.apply(export("ledger"));
    r.beta.apply(export("ledger"));
    // beta's ledger targets another port: a conflict, on beta's export.
    r.beta.edit("v1", "Service", "default/ledger", |s| {
        s["spec"]["ports"][0]["targetPort"] = json!(9999);
    });
    let condition = |server: &ApiServer| {
        server
            .get(
                "multicluster.x-k8s.io/v1alpha1",
                "ServiceExport",
                "default/ledger",
            )
            .and_then(|o| o["status"]["conditions"].as_array().cloned())
            .and_then(|c| c.first().cloned())
    };
    let conflicted = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(c) = condition(&r.beta)
                && c["status"] == json!("True")
            {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the conflict is written to beta's export");
    assert_eq!(conflicted["type"], json!("Conflict"));
    assert!(
        conflicted["message"]
            .as_str()
            .unwrap()
            .contains("ports differ from cluster alpha's"),
        "{conflicted}"
    );
    assert!(conflicted["lastTransitionTime"].is_string());
    // alpha's copy is the one used: its export carries no conflict.
    let alpha_condition = condition(&r.alpha).expect("alpha's export has a condition");
    assert_eq!(alpha_condition["status"], json!("False"));
    // The ports agree again: the condition is cleared.
    r.beta.edit("v1", "Service", "default/ledger", |s| {
        s["spec"]["ports"][0]["targetPort"] = json!(8080);
    });
    let cleared = tokio::time::timeout(DEADLINE, async {
        while condition(&r.beta).is_some_and(|c| c["status"] == json!("True")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(cleared.is_ok(), "the conflict is cleared");
    // Writes happen on change only: no patch storm from its own status events.
    let patches = r.beta.patches();
    r.alpha.apply(pod("unrelated", "alpha-1", "198.18.1.77"));
    r.until("the unrelated pod is in", |s| has(s, "unrelated"))
        .await;
    assert_eq!(
        r.beta.patches(),
        patches,
        "an unrelated change writes no status"
    );
}
