//! Objects Ferry cannot use are left out with a note, one bad object never blocks the rest,
//! and a policy Ferry cannot enforce exactly fails closed.

mod support;

use ferry_core::authz::{ConnInfo, Effect, authorize};
use ferry_core::identity::Identity;
use ferry_core::model::Health;
use ferry_core::snapshot::Snapshot;
use ferry_k8s::{MeshConfig, Note, translate};
use support::{cluster, mesh};

fn allowed(snap: &Snapshot, from_sa: &str, dst: &str, port: u16) -> bool {
    let id = Identity::new("cluster.local", "default", from_sa).unwrap();
    let w = snap
        .workloads()
        .find(|w| w.name == dst)
        .expect("destination");
    let conn = ConnInfo {
        source_identity: Some(&id),
        source_ip: "198.18.1.10".parse().unwrap(),
        destination_ip: w.addresses[0],
        destination_port: port,
        via_waypoint: false,
    };
    authorize(snap, w, &conn).effect == Effect::Allow
}

fn has_note(notes: &[Note], object: &str, text: &str) -> bool {
    notes
        .iter()
        .any(|n| n.object == object && n.message.contains(text))
}

#[test]
fn an_allow_policy_with_an_unsupported_field_matches_nothing() {
    let (before, _) = mesh("", "");
    assert!(allowed(&before, "sleep", "ledger-alpha", 8080));
    // The same policy name with `requestPrincipals` (JWT), which Ferry does not enforce.
    let doc = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ledger-jwt, namespace: default}
spec:
  selector: {matchLabels: {app: ledger}}
  action: ALLOW
  rules:
    - from: [{source: {requestPrincipals: [\"issuer/subject\"]}}]
";
    let (snap, notes) = mesh(doc, "");
    assert!(
        has_note(
            &notes,
            "AuthorizationPolicy default/ledger-jwt",
            "spec.rules[0].from[0].source.requestPrincipals is not supported: it matches nothing"
        ),
        "{notes:?}"
    );
    // Still allowed by ledger-from-sleep; the JWT policy grants nothing more.
    assert!(allowed(&snap, "sleep", "ledger-alpha", 8080));
    assert!(!allowed(&snap, "echo", "ledger-alpha", 8080));
}

#[test]
fn a_deny_policy_with_an_unsupported_condition_denies_everything_it_selects() {
    let doc = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-by-source-ip, namespace: default}
spec:
  selector: {matchLabels: {app: echo}}
  action: DENY
  rules:
    - when: [{key: source.ip, values: [\"198.18.9.9\"]}]
";
    let (snap, notes) = mesh(doc, "");
    assert!(has_note(
        &notes,
        "AuthorizationPolicy default/deny-by-source-ip",
        "it denies everything it selects"
    ));
    assert!(!allowed(&snap, "sleep", "echo-alpha-1", 8080));
    assert!(
        allowed(&snap, "sleep", "ledger-alpha", 8080),
        "other workloads are not touched"
    );
}

#[test]
fn a_policy_that_does_not_decode_still_fails_closed() {
    // `ports` must be strings; a number makes the object undecodable.
    let doc = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: broken, namespace: default}
spec:
  selector: {matchLabels: {app: echo}}
  action: DENY
  rules:
    - to: [{operation: {ports: [8080]}}]
";
    let (snap, notes) = mesh(doc, "");
    assert!(has_note(
        &notes,
        "AuthorizationPolicy default/broken",
        "kept as a policy that fails closed"
    ));
    assert!(!allowed(&snap, "sleep", "echo-alpha-1", 8080));
}

#[test]
fn a_pod_that_does_not_decode_is_left_out_and_the_rest_kept() {
    let doc = "\
apiVersion: v1
kind: Pod
metadata: {name: broken, namespace: default}
spec: {containers: 7}
";
    let (snap, notes) = mesh(doc, "");
    assert!(has_note(
        &notes,
        "Pod default/broken",
        "left out: it does not decode"
    ));
    assert!(snap.workloads().any(|w| w.name == "sleep"));
    assert!(!snap.workloads().any(|w| w.name == "broken"));
}

#[test]
fn a_pod_the_checks_reject_is_left_out_and_the_rest_kept() {
    // A second pod claiming sleep's address on the same network.
    let doc = "\
apiVersion: v1
kind: Pod
metadata: {name: impostor, namespace: default, labels: {app: echo}, annotations: {ambient.istio.io/redirection: enabled}}
spec: {nodeName: alpha-1, serviceAccountName: echo, containers: [{name: app, image: x}]}
status: {phase: Running, podIP: 198.18.1.10, conditions: [{type: Ready, status: 'True'}]}
";
    let (snap, notes) = mesh(doc, "");
    assert!(
        notes
            .iter()
            .any(|n| n.message.starts_with("left out: rejected by the checks")),
        "{notes:?}"
    );
    assert!(snap.workloads().any(|w| w.name == "echo-beta"));
    assert_eq!(
        snap.workloads()
            .filter(|w| w.addresses.contains(&"198.18.1.10".parse().unwrap()))
            .count(),
        1
    );
}

#[test]
fn copies_that_disagree_use_the_first_cluster_and_say_so() {
    // beta's ledger targets another port.
    let doc = "\
apiVersion: v1
kind: Service
metadata: {name: ledger, namespace: default}
spec:
  clusterIP: 198.18.11.2
  clusterIPs: [198.18.11.2]
  ports: [{name: http, port: 80, targetPort: 9999}]
  selector: {app: ledger}
";
    let (a, _) = cluster("alpha", "");
    let (mut b, _) = cluster("beta", "");
    b.services
        .retain(|s| s.metadata.name.as_deref() != Some("ledger"));
    b.add_yaml("extra", doc).unwrap();
    let (t, notes) = translate(&MeshConfig::default(), &[b, a])
        .into_topology()
        .unwrap();
    assert!(has_note(
        &notes,
        "Service default/ledger",
        "conflicts with cluster alpha on ports: cluster alpha's copy is used"
    ));
    let ledger_beta = t
        .snapshot
        .workloads()
        .find(|w| w.name == "ledger-beta")
        .unwrap();
    let key = ferry_core::model::ServiceKey::new("default", "ledger.default.svc.cluster.local");
    assert_eq!(ledger_beta.target_port(&key, 80), Some(8080));
}

#[test]
fn a_scope_that_does_not_parse_is_local() {
    let doc = "\
apiVersion: v1
kind: Service
metadata: {name: odd, namespace: default, annotations: {ferry.dev/scope: 'alpha,,beta'}}
spec: {clusterIP: 198.18.10.9, ports: [{port: 80, targetPort: 8080}], selector: {app: echo}}
";
    let (snap, notes) = mesh(doc, "");
    assert!(has_note(&notes, "Service default/odd", "taken as local"));
    let key = ferry_core::model::ServiceKey::new("default", "odd.default.svc.cluster.local");
    let svc = snap.service(&key).expect("odd");
    assert_eq!(
        svc.scope.default,
        ferry_core::model::ScopeRule::Local,
        "{:?}",
        svc.scope
    );
}

#[test]
fn a_root_namespace_policy_with_a_selector_applies_in_every_namespace() {
    let doc = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-echo-everywhere, namespace: istio-system}
spec: {selector: {matchLabels: {app: echo}}, action: DENY, rules: [{}]}
";
    let (snap, _) = mesh(doc, "");
    assert!(
        !allowed(&snap, "sleep", "echo-alpha-1", 8080),
        "default/echo is denied"
    );
    assert!(allowed(&snap, "sleep", "ledger-alpha", 8080));
}

#[test]
fn a_dry_run_policy_is_not_enforced_and_a_bad_dry_run_value_fails_closed() {
    let dry = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: dry, namespace: default, annotations: {istio.io/dry-run: 'true'}}
spec: {selector: {matchLabels: {app: echo}}, action: DENY, rules: [{}]}
";
    let (snap, _) = mesh(dry, "");
    assert!(
        allowed(&snap, "sleep", "echo-alpha-1", 8080),
        "dry run: reported, not enforced"
    );
    let odd = dry.replace("'true'", "'yes'");
    let (snap, notes) = mesh(&odd, "");
    assert!(has_note(
        &notes,
        "AuthorizationPolicy default/dry",
        "istio.io/dry-run"
    ));
    assert!(
        !allowed(&snap, "sleep", "echo-alpha-1", 8080),
        "an unknown value is enforced, failing closed"
    );
}

#[test]
fn two_conditions_on_one_header_fail_closed() {
    let doc = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: env, namespace: default}
spec:
  selector: {matchLabels: {app: ledger}}
  action: ALLOW
  rules:
    - when: [{key: 'request.headers[x-env]', values: [prod]}, {key: 'request.headers[X-Env]', values: [staging]}]
";
    let (_, notes) = mesh(doc, "");
    assert!(has_note(
        &notes,
        "AuthorizationPolicy default/env",
        "a second condition on header"
    ));
}

#[test]
fn each_cluster_s_policy_governs_its_own_workloads() {
    // Only beta has this ALLOW: alpha's ledger is not narrowed by it.
    let doc = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: echo-only-from-echo, namespace: default}
spec:
  selector: {matchLabels: {app: echo}}
  action: ALLOW
  rules: [{from: [{source: {principals: [cluster.local/ns/default/sa/echo]}}]}]
";
    let (snap, _) = mesh("", doc);
    assert!(
        allowed(&snap, "sleep", "echo-alpha-1", 8080),
        "alpha's echo: no ALLOW policy"
    );
    assert!(
        !allowed(&snap, "sleep", "echo-beta", 8080),
        "beta's echo: only from echo"
    );
    assert!(allowed(&snap, "echo", "echo-beta", 8080));
}

#[test]
fn exporting_a_service_never_widens_its_declared_scope() {
    let doc = "\
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Service
    metadata: {name: vault, namespace: default, annotations: {ferry.dev/scope: local}}
    spec: {clusterIP: 198.18.10.30, ports: [{port: 80, targetPort: 8080}], selector: {app: ledger}}
  - apiVersion: multicluster.x-k8s.io/v1alpha1
    kind: ServiceExport
    metadata: {name: vault, namespace: default}
";
    let (snap, _) = mesh(doc, "");
    let key = ferry_core::model::ServiceKey::new("default", "vault.default.svc.clusterset.local");
    let svc = snap.service(&key).expect("exported");
    assert_eq!(
        svc.scope.by_cluster.get(&"alpha".into()),
        Some(&ferry_core::model::ScopeRule::Local),
        "{:?}",
        svc.scope
    );
}

#[test]
fn a_scope_naming_an_unknown_cluster_keeps_the_known_ones() {
    let doc = "\
apiVersion: v1
kind: Service
metadata: {name: odd, namespace: default, annotations: {ferry.dev/scope: 'beta,gamma'}}
spec: {clusterIP: 198.18.10.9, ports: [{port: 80, targetPort: 8080}], selector: {app: echo}}
";
    let (snap, notes) = mesh(doc, "");
    assert!(has_note(
        &notes,
        "Service default/odd",
        "no cluster [\"gamma\"]"
    ));
    let key = ferry_core::model::ServiceKey::new("default", "odd.default.svc.cluster.local");
    assert!(snap.service(&key).is_some(), "the service is kept");
}

#[test]
fn a_pod_asked_into_the_mesh_but_not_redirected_is_plain_tcp() {
    let doc = "\
apiVersion: v1
kind: Pod
metadata: {name: fresh, namespace: default, labels: {app: echo}}
spec: {nodeName: alpha-1, serviceAccountName: echo, containers: [{name: app, image: x}]}
status: {phase: Running, podIP: 198.18.1.99, conditions: [{type: Ready, status: 'True'}]}
";
    let (snap, notes) = mesh(doc, "");
    assert!(has_note(&notes, "Pod default/fresh", "not redirected yet"));
    let w = snap.workloads().find(|w| w.name == "fresh").unwrap();
    assert_eq!(w.tunnel, ferry_core::model::TunnelProtocol::Tcp);
}

#[test]
fn a_failover_minimum_annotation_is_graduated_failover_and_a_bad_one_a_note() {
    use ferry_core::model::{FailoverMinimum, LbMode, ServiceKey};
    let doc = "\
apiVersion: v1
kind: Service
metadata: {name: spill, namespace: default, annotations: {ferry.dev/failover-min-healthy: '2'}}
spec: {clusterIP: 198.18.10.21, ports: [{port: 80, targetPort: 8080}], selector: {app: echo}}
---
apiVersion: v1
kind: Service
metadata: {name: share, namespace: default, annotations: {ferry.dev/failover-min-healthy: '60%'}}
spec: {clusterIP: 198.18.10.22, ports: [{port: 80, targetPort: 8080}], selector: {app: echo}}
---
apiVersion: v1
kind: Service
metadata: {name: wrong, namespace: default, annotations: {ferry.dev/failover-min-healthy: '0'}}
spec: {clusterIP: 198.18.10.23, ports: [{port: 80, targetPort: 8080}], selector: {app: echo}, trafficDistribution: PreferClose}
";
    let (snap, notes) = mesh(doc, "");
    let lb = |name: &str| {
        let key = ServiceKey::new("default", format!("{name}.default.svc.cluster.local"));
        snap.service(&key)
            .and_then(|s| s.load_balancing.clone())
            .unwrap_or_else(|| panic!("{name} has load balancing"))
    };
    let spill = lb("spill");
    assert_eq!(spill.mode, LbMode::Failover);
    assert_eq!(spill.failover_minimum, Some(FailoverMinimum::Endpoints(2)));
    assert_eq!(spill.routing_preference.len(), 5, "PreferClose's tiers");
    assert_eq!(
        lb("share").failover_minimum,
        Some(FailoverMinimum::Percent(60))
    );
    // A bad value is left out, with a note; the service keeps its PreferClose failover.
    assert!(has_note(
        &notes,
        "Service default/wrong",
        "ferry.dev/failover-min-healthy left out: expected a failover minimum of at least 1 endpoint, found 0"
    ));
    assert_eq!(lb("wrong").failover_minimum, None);
    assert_eq!(lb("wrong").mode, LbMode::Failover);
}

#[test]
fn an_endpoint_slice_that_does_not_decode_is_left_out_and_the_rest_kept() {
    // `endpoints` must be a list. The good slice next to it still decides its pod's state.
    let doc = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-broken, namespace: default, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
endpoints: 7
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-good, namespace: default, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
endpoints:
  - addresses: [198.18.2.20]
    conditions: {ready: false, serving: false, terminating: false}
    targetRef: {kind: Pod, namespace: default, name: echo-alpha-2, uid: 0000-echo-alpha-2}
";
    let (snap, notes) = mesh(doc, "");
    assert!(
        has_note(
            &notes,
            "EndpointSlice default/echo-broken",
            "left out: it does not decode"
        ),
        "{notes:?}"
    );
    let health = |name: &str| snap.workloads().find(|w| w.name == name).unwrap().health;
    assert_eq!(health("echo-alpha-2"), Health::Unhealthy, "the good slice");
    assert_eq!(health("echo-alpha-1"), Health::Healthy, "its own Ready");
    assert!(snap.workloads().any(|w| w.name == "sleep"));
}

#[test]
fn endpoints_that_name_no_pod_are_a_note_except_the_api_server_s() {
    let doc = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: external-db-1, namespace: default, labels: {kubernetes.io/service-name: external-db}}
addressType: IPv4
endpoints: [{addresses: [10.9.0.1]}, {addresses: [10.9.0.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kubernetes, namespace: default, labels: {kubernetes.io/service-name: kubernetes}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
";
    let (_, notes) = mesh(doc, "");
    assert!(
        has_note(
            &notes,
            "EndpointSlice default/external-db-1",
            "2 endpoint(s) left out: they name no pod (no targetRef)"
        ),
        "{notes:?}"
    );
    assert!(
        !notes
            .iter()
            .any(|n| n.object == "EndpointSlice default/kubernetes"),
        "{notes:?}"
    );
}
