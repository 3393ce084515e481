//! Kubernetes edits translated incrementally equal a whole translation: random sequences of
//! object edits in two clusters (pods added, changed, removed, made to clash; EndpointSlices
//! changed, added, removed; a selector-less Service's slice and the pod it names; a waypoint's
//! pod; now and then a Service; an exported Service whose cluster-set address is allocated from
//! a range pods take addresses from), each translated as the watch translates it
//! (`ferry_k8s::translate::incremental::Translator`, told what changed, as the watch's caches
//! tell it) and served as `ferry control` serves it (`Served::edited` for an edit of pods, else
//! `Served::next`), against a whole translation and a whole encoding of the same objects. The
//! snapshot, every resource served and the notes (in any order) must be equal; a rejected mesh
//! must be rejected with the same error. Seeded (`ferry_core::testing::Gen`): a failure names
//! its seed and step.

use std::collections::BTreeMap;

use ferry_control::served::Served;
use ferry_core::random::SplitMix64;
use ferry_core::testing::Gen;
use ferry_k8s::translate::incremental::{Changed, Translator};
use ferry_k8s::{ClusterObjects, MeshConfig, Note, translate};
use serde_json::{Value, json};

const SEEDS: u64 = 40;
const STEPS: usize = 40;
const CLUSTERS: [&str; 2] = ["c0", "c1"];

/// `(kind, namespace, name)`: the model's key, in the order the watch keeps objects.
type Key = (&'static str, String, String);

/// Every cluster's objects, by key.
struct Model {
    clusters: Vec<BTreeMap<Key, Value>>,
    next: usize,
}

impl Model {
    fn objects(&self) -> Vec<ClusterObjects> {
        CLUSTERS
            .iter()
            .zip(&self.clusters)
            .map(|(id, objects)| {
                let mut c = ClusterObjects::new(*id);
                let mut notes = Vec::new();
                for v in objects.values() {
                    c.add_value(v.clone(), &mut notes);
                }
                assert!(notes.is_empty(), "{notes:?}");
                c
            })
            .collect()
    }

    fn names(&self, c: usize, kind: &str) -> Vec<Key> {
        self.clusters[c]
            .keys()
            .filter(|k| k.0 == kind)
            .cloned()
            .collect()
    }

    fn put(&mut self, c: usize, kind: &'static str, v: Value) {
        let ns = v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = v["metadata"]["name"].as_str().unwrap().to_string();
        self.clusters[c].insert((kind, ns, name), v);
    }
}

fn pod(g: &mut Gen, c: usize, name: &str, ns: &str, taken: &[String]) -> Value {
    let mut labels = json!({"app": g.pick_owned(&["a", "b", "c"])});
    if g.chance(15) {
        labels["istio.io/use-waypoint"] = json!(g.pick_owned(&["wp", "nowhere", "none"]));
    }
    let mut annotations = json!({});
    if g.chance(85) {
        annotations["ambient.istio.io/redirection"] = json!("enabled");
    }
    let ip = if g.chance(3) && !taken.is_empty() {
        // The address of another pod: one of the two is left out.
        Some(g.pick_owned(taken))
    } else if g.chance(8) {
        None
    } else if g.chance(10) {
        // Within the cluster-set range: an exported service's address is allocated around it.
        Some(format!("198.18.10.{}", 8 + g.below(8)))
    } else {
        Some(format!(
            "198.18.{}.{}",
            10 + 4 * c + g.below(4),
            10 + g.below(240)
        ))
    };
    let node = if g.chance(10) {
        "elsewhere".to_string()
    } else {
        format!("{}-n{}", CLUSTERS[c], g.below(2))
    };
    let mut ports = json!([]);
    if g.chance(50) {
        ports = json!([{"name": "http", "containerPort": 8080}]);
    }
    let mut status = json!({
        "phase": if g.chance(5) { "Succeeded" } else { "Running" },
        "conditions": [{"type": "Ready", "status": if g.chance(80) { "True" } else { "False" }}],
    });
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": labels, "annotations": annotations},
        "spec": {"nodeName": node, "serviceAccountName": "sa", "containers": [{"name": "app", "image": "x", "ports": ports}]},
        "status": status})
}

/// A slice of `service` naming some of `pods`, with random conditions, and at times an
/// endpoint that names no pod.
fn slice(g: &mut Gen, name: &str, service: &str, pods: &[Key]) -> Value {
    let mut endpoints = Vec::new();
    for (_, ns, p) in pods {
        if g.chance(40) {
            let mut conditions = json!({});
            if g.chance(30) {
                conditions["serving"] = json!(g.chance(50));
            }
            if g.chance(20) {
                conditions["terminating"] = json!(g.chance(50));
            }
            let uid = if g.chance(10) {
                "an-earlier-pod".to_string()
            } else {
                format!("uid-{p}")
            };
            endpoints.push(
                json!({"addresses": ["198.18.99.1"], "conditions": conditions,
                "targetRef": {"kind": "Pod", "namespace": ns, "name": p, "uid": uid}}),
            );
        }
    }
    if g.chance(15) {
        endpoints.push(json!({"addresses": ["198.18.99.2"]}));
    }
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": "ns0", "labels": {"kubernetes.io/service-name": service}},
        "endpoints": endpoints, "ports": [{"name": "http", "port": 8080}]})
}

fn service(name: &str, ip: &str, selector: Option<Value>, target: &Value) -> Value {
    let mut spec =
        json!({"clusterIP": ip, "ports": [{"name": "http", "port": 80, "targetPort": target}]});
    if let Some(s) = selector {
        spec["selector"] = s;
    }
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "ns0", "labels": {"istio.io/global": "true"}},
        "spec": spec})
}

fn start(g: &mut Gen) -> Model {
    let mut m = Model {
        clusters: vec![BTreeMap::new(), BTreeMap::new()],
        next: 0,
    };
    for (c, id) in CLUSTERS.iter().enumerate() {
        let fixed = [
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system", "labels": {"topology.istio.io/network": "flat"}}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns0", "labels": {"istio.io/dataplane-mode": "ambient"}}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns1"}}),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("{id}-n0"), "labels": {"topology.kubernetes.io/zone": "z0"}}}),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("{id}-n1"), "labels": {"topology.kubernetes.io/zone": "z1"}}}),
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "wp", "namespace": "ns0", "labels": {"istio.io/waypoint-for": "workload"}},
                "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}}),
            service(
                "wp",
                &format!("198.18.{}.250", 20 + c),
                Some(json!({"gateway.networking.k8s.io/gateway-name": "wp"})),
                &json!(15008),
            ),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "wp-0", "namespace": "ns0", "uid": "uid-wp-0", "labels": {"gateway.networking.k8s.io/gateway-name": "wp"}},
                "spec": {"nodeName": format!("{id}-n0"), "serviceAccountName": "wp", "containers": [{"name": "istio-proxy", "image": "x"}]},
                "status": {"phase": "Running", "podIP": format!("198.18.{}.251", 20 + c), "conditions": [{"type": "Ready", "status": "True"}]}}),
            service(
                "svc-a",
                &format!("198.18.{}.1", 20 + c),
                Some(json!({"app": "a"})),
                &json!(8080),
            ),
            service(
                "svc-b",
                &format!("198.18.{}.2", 20 + c),
                Some(json!({"app": "b"})),
                &json!("http"),
            ),
            service(
                "manual",
                &format!("198.18.{}.3", 20 + c),
                None,
                &json!(8080),
            ),
            json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
                "metadata": {"name": "svc-a", "namespace": "ns0"}}),
            json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
                "metadata": {"name": "allow-a", "namespace": "ns0"},
                "spec": {"selector": {"matchLabels": {"app": "a"}}, "action": "ALLOW",
                         "rules": [{"to": [{"operation": {"ports": ["8080"]}}]}]}}),
        ];
        for v in fixed {
            let kind = match v["kind"].as_str().unwrap() {
                "Namespace" => "Namespace",
                "Node" => "Node",
                "Gateway" => "Gateway",
                "Service" => "Service",
                "Pod" => "Pod",
                "ServiceExport" => "ServiceExport",
                _ => "AuthorizationPolicy",
            };
            m.put(c, kind, v);
        }
        for _ in 0..8 {
            add_pod(g, &mut m, c);
        }
        let pods = m.names(c, "Pod");
        let manual = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "manual-1", "namespace": "ns0", "labels": {"kubernetes.io/service-name": "manual"}},
            "endpoints": [{"addresses": [format!("198.18.{}.240", 20 + c)]},
                          {"addresses": ["198.18.99.3"], "targetRef": {"kind": "Pod", "namespace": "ns0", "name": pods[0].2.clone()}}],
            "ports": [{"name": "http", "port": 8080}]});
        m.put(c, "EndpointSlice", manual);
        for s in ["svc-a", "svc-b"] {
            let v = slice(g, &format!("{s}-1"), s, &pods);
            m.put(c, "EndpointSlice", v);
        }
    }
    m
}

fn add_pod(g: &mut Gen, m: &mut Model, c: usize) -> Key {
    let name = format!("p-{}", m.next);
    m.next += 1;
    let ns = g.pick_owned(&["ns0", "ns0", "ns1"]);
    let taken = ips(m, c);
    let v = pod(g, c, &name, ns, &taken);
    m.put(c, "Pod", v);
    ("Pod", ns.to_string(), name)
}

fn ips(m: &Model, c: usize) -> Vec<String> {
    m.clusters[c]
        .values()
        .filter_map(|v| v["status"]["podIP"].as_str().map(str::to_string))
        .collect()
}

/// One random edit of `m`, and what it changed, as the watch's caches say.
fn edit(g: &mut Gen, m: &mut Model) -> Changed {
    let c = g.below(CLUSTERS.len());
    let id = CLUSTERS[c].to_string();
    let mut changed = Changed::default();
    let pods = m.names(c, "Pod");
    let roll = g.below(100);
    let touched_pod = |key: &Key, changed: &mut Changed| {
        changed
            .pods
            .insert((id.clone(), key.1.clone(), key.2.clone()));
    };
    match roll {
        0..30 if !pods.is_empty() => {
            // Changed in place (the waypoint's pod and the manual slice's now and then).
            let key = g.pick_owned(&pods);
            let taken: Vec<String> = ips(m, c);
            let v = if key.2 == "wp-0" {
                let mut v = m.clusters[c][&key].clone();
                v["status"]["podIP"] = json!(format!("198.18.{}.{}", 20 + c, 200 + g.below(40)));
                v
            } else {
                pod(g, c, &key.2, &key.1, &taken)
            };
            m.clusters[c].insert(key.clone(), v);
            touched_pod(&key, &mut changed);
        }
        30..50 => {
            let key = add_pod(g, m, c);
            touched_pod(&key, &mut changed);
        }
        50..62 if !pods.is_empty() => {
            let key = g.pick_owned(&pods);
            m.clusters[c].remove(&key);
            touched_pod(&key, &mut changed);
        }
        62..85 => {
            let s = g.pick_owned(&["svc-a", "svc-b"]);
            let name = format!("{s}-{}", 1 + g.below(2));
            let key: Key = ("EndpointSlice", "ns0".into(), name.clone());
            if g.chance(20) {
                m.clusters[c].remove(&key);
            } else {
                let v = slice(g, &name, s, &pods);
                m.clusters[c].insert(key, v);
            }
            changed.slices.insert((id, "ns0".into(), name));
        }
        85..90 if !pods.is_empty() => {
            // The selector-less Service's slice names another pod.
            let key: Key = ("EndpointSlice", "ns0".into(), "manual-1".into());
            // A pod of the slice's namespace (a Service's endpoints are of its namespace).
            let same: Vec<Key> = pods.iter().filter(|k| k.1 == "ns0").cloned().collect();
            let target = g.pick_owned(if same.is_empty() { &pods } else { &same });
            if let Some(v) = m.clusters[c].get_mut(&key) {
                v["endpoints"][1]["targetRef"]["name"] = json!(target.2);
                v["endpoints"][1]["targetRef"]["namespace"] = json!(target.1);
            }
            changed.slices.insert((id, "ns0".into(), "manual-1".into()));
        }
        90..95 => {
            // A Service changes: everything is translated.
            let app = g.pick_owned(&["b", "c"]);
            let v = service(
                "svc-b",
                &format!("198.18.{}.2", 20 + c),
                Some(json!({"app": app})),
                &json!("http"),
            );
            m.put(c, "Service", v);
            changed.whole = true;
        }
        _ => {}
    }
    changed
}

fn sorted(mut notes: Vec<Note>) -> Vec<Note> {
    notes.sort_by(|a, b| {
        (&a.cluster, &a.object, &a.message).cmp(&(&b.cluster, &b.object, &b.message))
    });
    notes
}

#[test]
fn kubernetes_edits_translated_incrementally_equal_a_whole_translation() {
    // Cluster-set addresses from a range pods use too: an allocation moves with them.
    let mesh = MeshConfig {
        clusterset_cidr: (std::net::Ipv4Addr::new(198, 18, 10, 8), 29),
        ..MeshConfig::default()
    };
    let (mut incremental, mut valid) = (0, 0);
    for seed in 0..SEEDS {
        let mut g = Gen(SplitMix64::new(seed));
        let mut m = start(&mut g);
        let mut translator = Translator::default();
        let objects = m.objects();
        let refs: Vec<&ClusterObjects> = objects.iter().collect();
        let first = translator
            .translate(&mesh, &refs, &Changed::whole())
            .unwrap_or_else(|e| panic!("seed {seed}: the first mesh: {e}"));
        let mut served = Served::new(&first.topology.snapshot);
        for step in 0..STEPS {
            let changed = edit(&mut g, &mut m);
            let objects = m.objects();
            let refs: Vec<&ClusterObjects> = objects.iter().collect();
            let got = translator.translate(&mesh, &refs, &changed);
            let full = translate(&mesh, &objects).into_topology();
            let at = format!("seed {seed} step {step} ({changed:?})");
            match (got, full) {
                (Ok(got), Ok((full, notes))) => {
                    valid += 1;
                    let edited = got.edit.is_some();
                    incremental += usize::from(edited);
                    assert!(
                        got.topology.snapshot == full.snapshot,
                        "{at}: the snapshot differs from a whole translation (incremental: {edited})"
                    );
                    assert_eq!(sorted(got.notes), sorted(notes), "{at}: other notes");
                    let next = match &got.edit {
                        Some(e) => served.edited(&got.topology.snapshot, &e.workloads),
                        None => served.next(&got.topology.snapshot),
                    };
                    let whole = Served::new(&full.snapshot);
                    assert_eq!(
                        next.resources().by_type,
                        whole.resources().by_type,
                        "{at}: the resources differ from a whole encoding (incremental: {edited})"
                    );
                    served = next;
                }
                (Err(got), Err(full)) => {
                    assert_eq!(got.to_string(), full.to_string(), "{at}: another error");
                }
                (got, full) => panic!(
                    "{at}: incremental {:?} but whole {:?}",
                    got.map(|t| t.edit.is_some()),
                    full.map(|_| ())
                ),
            }
        }
    }
    eprintln!("{incremental} of {valid} valid edits incremental");
    // The incremental path was taken, and not only it.
    assert!(
        incremental * 3 > valid && incremental < valid,
        "{incremental} of {valid} valid edits incremental"
    );
}
