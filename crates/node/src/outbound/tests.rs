use ferry_core::model::Health;
use ferry_core::testing::MeshBuilder;
use ferry_hbone::headers::valid_traceparent;
use ferry_runtime::conn::ResponseFlag;

use super::*;

static NONE_EJECTED: Ejected = Ejected::NONE;

fn mesh() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east");
    m.node("east-1", "east", "us-east/a/r1")
        .node("east-2", "east", "us-east/b/r1");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.pod("echo", "east-2", "198.18.2.20").labels = [("app", "echo-app"), ("version", "v1")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    m.service("echo", &[("net-east", "198.18.100.1")], 80, 8080);
    m.backs("echo", "echo");
    m
}

fn plan_from_sleep(snap: &Snapshot, to: &str) -> Result<Ctx, Refused> {
    plan_from_sleep_traced(snap, to, None)
}

fn plan_from_sleep_traced(
    snap: &Snapshot,
    to: &str,
    trace: Option<&mut Compact>,
) -> Result<Ctx, Refused> {
    let src = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .clone();
    let identity = src.identity().unwrap();
    plan(
        snap,
        &src,
        &identity,
        ("198.18.1.10:40000".parse().unwrap(), to.parse().unwrap()),
        Avoid {
            failed: &[],
            ejected: &NONE_EJECTED,
        },
        &mut SplitMix64::new(7),
        trace,
    )
}

#[test]
fn a_traced_plan_is_the_same_plan_and_its_record_says_the_class_the_pick_and_the_transport() {
    let snap = mesh().build();
    let plain = plan_from_sleep(&snap, "198.18.100.1:80").expect("planned");
    let mut c = Compact::new();
    let traced = plan_from_sleep_traced(&snap, "198.18.100.1:80", Some(&mut c)).expect("planned");
    assert_eq!(plain.transport, traced.transport);
    assert_eq!(plain.log, traced.log);
    let s = c.summary();
    assert!(
        s.starts_with("service default/echo.default.svc.cluster.local:80; "),
        "{s}"
    );
    assert!(s.contains("picked "), "{s}");
    assert!(s.ends_with("hbone to 198.18.2.20:15008"), "{s}");
}

#[test]
fn a_service_in_the_mesh_is_one_tunnel_labelled_and_logged_once() {
    let ctx = plan_from_sleep(&mesh().build(), "198.18.100.1:80").expect("planned");
    match &ctx.transport {
        Transport::Hbone { connect_to, .. } => {
            assert_eq!(connect_to.to_string(), "198.18.2.20:15008");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(ctx.log.path.to_string(), "hbone");
    // ztunnel's meanings: the address dialled, then the target inside the tunnel.
    assert_eq!(ctx.log.dst_addr.to_string(), "198.18.2.20:15008");
    assert_eq!(ctx.log.dst_hbone_addr.to_string(), "198.18.2.20:8080");
    assert_eq!(
        ctx.log.dst_workload.to_string(),
        "east//v1/Pod/default/echo"
    );
    assert_eq!(
        ctx.log.dst_identity.to_string(),
        "spiffe://cluster.local/ns/default/sa/echo"
    );
    assert_eq!(ctx.labels.reporter, Reporter::Source);
    assert_eq!(ctx.labels.source_workload, "sleep");
    assert_eq!(ctx.labels.destination_workload, "echo");
    assert_eq!(
        ctx.labels.destination_service,
        "echo.default.svc.cluster.local"
    );
    assert_eq!(
        ctx.labels.destination_principal,
        ctx.log.dst_identity.to_string()
    );
    assert_eq!(ctx.labels.response_flags, "-");
    // Istio's standard set: both workloads' namespaces and canonical services (sleep has no
    // labels: its name; echo's `app`), the service's name and namespace, mutual TLS.
    let l = &ctx.labels;
    assert_eq!(
        [
            &l.source_workload_namespace,
            &l.source_canonical_service,
            &l.source_canonical_revision,
            &l.destination_workload_namespace,
            &l.destination_canonical_service,
            &l.destination_canonical_revision,
            &l.destination_service_name,
            &l.destination_service_namespace,
        ],
        [
            "default", "sleep", "latest", "default", "echo-app", "v1", "echo", "default"
        ]
    );
    assert_eq!(l.connection_security_policy, SecurityPolicy::MutualTls);
    // The tunnel's metadata: Istio's baggage keys, the real source, the service, a trace.
    let baggage = ctx.headers.typed_baggage();
    assert_eq!(baggage.cluster.as_deref(), Some("east"));
    assert_eq!(baggage.namespace.as_deref(), Some("default"));
    assert_eq!(
        baggage.workload,
        Some(WorkloadName {
            kind: WorkloadKind::Pod,
            name: "sleep".into()
        })
    );
    assert!(
        ctx.headers
            .baggage
            .contains(&("k8s.pod.name".into(), "sleep".into()))
    );
    // Istio's canonical service keys, which a stock ztunnel labels an unknown source with.
    assert_eq!(baggage.service.as_deref(), Some("sleep"));
    assert_eq!(baggage.revision.as_deref(), Some("latest"));
    assert_eq!(
        ctx.headers.forwarded_for,
        Some("198.18.1.10:40000".parse().unwrap())
    );
    assert_eq!(
        ctx.headers.forwarded_host.as_deref(),
        Some("echo.default.svc.cluster.local")
    );
    assert!(valid_traceparent(
        ctx.headers.traceparent.as_deref().unwrap()
    ));
    assert_eq!(ctx.headers.forwarded_network, None);
}

#[test]
fn through_a_waypoint_the_log_dials_the_waypoint_and_asks_it_for_the_service() {
    let mut m = mesh();
    m.waypoint("wp", ferry_core::model::WaypointFor::Service);
    m.waypoint_pod("wp", "wp-1", "east-2", "198.18.2.50");
    m.service_mut("echo").waypoint = Some(ferry_core::testing::waypoint_ref("wp"));
    let ctx = plan_from_sleep(&m.build(), "198.18.100.1:80").expect("planned");
    assert!(
        ctx.log.path.to_string().starts_with("hbone via waypoint"),
        "{}",
        ctx.log.path
    );
    assert_eq!(ctx.log.dst_addr.to_string(), "198.18.2.50:15008");
    assert_eq!(ctx.log.dst_hbone_addr.to_string(), "198.18.100.1:80");
}

#[test]
fn an_address_out_of_the_mesh_passes_through_with_unknown_labels() {
    let ctx = plan_from_sleep(&mesh().build(), "198.18.3.90:8080").expect("planned");
    assert!(
        matches!(ctx.transport, Transport::Passthrough { connect_to } if connect_to.to_string() == "198.18.3.90:8080"),
        "{:?}",
        ctx.transport
    );
    assert_eq!(ctx.log.path.to_string(), "passthrough");
    assert_eq!(ctx.log.dst_addr.to_string(), "198.18.3.90:8080");
    assert_eq!(ctx.log.dst_hbone_addr.to_string(), "");
    assert_eq!(ctx.labels.destination_workload, "unknown");
    assert_eq!(ctx.labels.destination_principal, "unknown");
    assert_eq!(ctx.labels.destination_canonical_service, "unknown");
    assert_eq!(ctx.labels.destination_service_name, "unknown");
    assert_eq!(ctx.labels.connection_security_policy, SecurityPolicy::None);
}

#[test]
fn a_service_with_no_eligible_endpoint_is_refused_as_no_route() {
    let mut m = mesh();
    m.workload_mut("echo").health = Health::Unhealthy;
    let refused = plan_from_sleep(&m.build(), "198.18.100.1:80").expect_err("no endpoint");
    assert_eq!(refused.error.flag, ResponseFlag::NoRoute);
    assert_eq!(refused.error.side, ferry_hbone::Side::Local);
    assert_eq!(refused.labels.response_flags, "NoRoute");
    assert_eq!(refused.labels.source_workload, "sleep");
    // Refused before a transport was chosen.
    assert_eq!(
        refused.labels.connection_security_policy,
        SecurityPolicy::Unknown
    );
    assert!(
        refused
            .error
            .to_string()
            .contains("no endpoint is eligible"),
        "{}",
        refused.error
    );
}

#[test]
fn the_same_seed_gives_the_same_trace_and_another_a_different_one() {
    let snap = mesh().build();
    let a = plan_from_sleep(&snap, "198.18.100.1:80").unwrap();
    let b = plan_from_sleep(&snap, "198.18.100.1:80").unwrap();
    assert_eq!(a.headers.traceparent, b.headers.traceparent);
    let mut r = SplitMix64::new(8);
    assert_ne!(Some(traceparent(&mut r)), a.headers.traceparent);
}

/// A connect to `echo` refused before any byte was sent, with the labels of its attempt.
fn refused_connect(snap: &Snapshot) -> (ConnError, Labels) {
    let ctx = plan_from_sleep(snap, "198.18.100.1:80").unwrap();
    let e = ConnError::connect(
        "198.18.2.20:15008".parse().unwrap(),
        std::io::ErrorKind::ConnectionRefused.into(),
    );
    assert!(e.retryable());
    (e, ctx.labels)
}

#[test]
fn a_retry_is_one_only_when_another_endpoint_is_planned() {
    let mut m = mesh();
    m.pod("echo-2", "east-1", "198.18.1.20");
    m.backs("echo-2", "echo");
    let snap = m.build();
    // Another endpoint after the failure: a retry, carrying the failure it follows.
    match next_attempt(
        plan_from_sleep(&snap, "198.18.100.1:80"),
        Some(refused_connect(&snap)),
    ) {
        Attempt::Retry(_, e) => assert_eq!(e.flag, ResponseFlag::ConnectionFailure),
        other => panic!("{other:?}"),
    }
    // None left (the only endpoint excluded): no retry, the connection fails as its attempt
    // did, not as a refusal of the routing decision.
    let one = mesh().build();
    let mut alone = mesh();
    alone.workload_mut("echo").health = Health::Unhealthy;
    match next_attempt(
        plan_from_sleep(&alone.build(), "198.18.100.1:80"),
        Some(refused_connect(&one)),
    ) {
        Attempt::Failed(e, labels) => {
            assert_eq!(e.flag, ResponseFlag::ConnectionFailure);
            assert!(e.retryable(), "{e}");
            assert_eq!(labels.destination_workload, "echo");
        }
        other => panic!("{other:?}"),
    }
    // A first attempt is no retry.
    assert!(matches!(
        next_attempt(plan_from_sleep(&one, "198.18.100.1:80"), None),
        Attempt::First(_)
    ));
}

/// A connection keeps its log fields for as long as it lives (issue 21: they were a dozen
/// separately allocated strings per idle connection): the addresses are held as addresses, the
/// workload, cluster and identity as the snapshot's own shared strings, the path as a fixed
/// word. Only the service's `namespace/hostname` is text of its own.
#[test]
fn a_planned_connection_holds_its_log_fields_without_copies_of_the_snapshots_names() {
    let snap = mesh().build();
    let ctx = plan_from_sleep(&snap, "198.18.100.1:80").expect("planned");
    let echo = snap.workloads().find(|w| w.name == "echo").unwrap();
    let shares = |field: &Text, with: Arc<str>| match field {
        Text::Shared(s) => Arc::ptr_eq(s, &with),
        _ => false,
    };
    assert!(
        shares(&ctx.log.dst_workload, echo.uid.shared()),
        "{:?}",
        ctx.log.dst_workload
    );
    assert!(
        shares(&ctx.log.dst_cluster, echo.cluster.shared()),
        "{:?}",
        ctx.log.dst_cluster
    );
    let Transport::Hbone { identities, .. } = &ctx.transport else {
        panic!("{:?}", ctx.transport);
    };
    assert!(
        shares(&ctx.log.dst_identity, identities[0].shared()),
        "{:?}",
        ctx.log.dst_identity
    );
    assert!(matches!(ctx.log.dst_addr, Text::Addr(_)));
    assert!(matches!(ctx.log.dst_hbone_addr, Text::Addr(_)));
    assert!(matches!(ctx.log.path, Text::Static("hbone")));
    let LogFields {
        dst_workload,
        dst_service,
        dst_addr,
        dst_hbone_addr,
        dst_identity,
        dst_cluster,
        path,
    } = &ctx.log;
    let owned: usize = [
        dst_workload,
        dst_addr,
        dst_hbone_addr,
        dst_identity,
        dst_cluster,
        path,
    ]
    .iter()
    .map(|t| t.owned_bytes())
    .sum();
    assert_eq!(owned, 0, "{:?}", ctx.log);
    assert_eq!(
        dst_service.to_string(),
        "default/echo.default.svc.cluster.local"
    );
}

fn size_of_output<F, A, B, C, D, Fut>(_: F) -> usize
where
    F: FnOnce(A, B, C, D) -> Fut,
{
    std::mem::size_of::<Fut>()
}

/// A held connection's task keeps this future (its log fields inline) for the connection's
/// whole life: 1,456 bytes in a debug build with the fields as [`Text`] (issue 21).
#[test]
fn a_held_connection_keeps_a_small_task() {
    let size = size_of_output(handle);
    assert!(
        size <= 1536,
        "the outbound connection's future is {size} bytes"
    );
}
