//! Istio's protocol selection, table by table, and the waypoint's upstream HTTP version.

use super::*;
use crate::model::{AppProtocol as P, ServiceKey, ServicePort, WorkloadUid};
use crate::route::Transport;
use crate::testing::MeshBuilder;

#[test]
fn app_protocol_wins_over_the_name_and_names_are_read_by_their_prefix() {
    let cases: &[(Option<&str>, Option<&str>, AppProtocol)] = &[
        // By name: `<protocol>[-<suffix>]`, case ignored.
        (None, Some("http"), P::Http11),
        (None, Some("http-web"), P::Http11),
        (None, Some("HTTP2"), P::Http2),
        (None, Some("http2-api"), P::Http2),
        (None, Some("grpc"), P::Grpc),
        (None, Some("gRPC-health"), P::Grpc),
        // Not a protocol prefix: TCP for Istio, unknown on the wire.
        (None, Some("web"), P::Unknown),
        (None, Some("httpx"), P::Unknown),
        (None, Some("tcp-db"), P::Unknown),
        (None, Some("https"), P::Unknown),
        (None, None, P::Unknown),
        // grpc-web is its own protocol, with no value in WDS.
        (None, Some("grpc-web"), P::Unknown),
        (None, Some("grpc-web-ui"), P::Unknown),
        // appProtocol first, whatever the name says.
        (Some("grpc"), Some("http-web"), P::Grpc),
        (Some("http"), Some("grpc"), P::Http11),
        (Some("tcp"), Some("grpc"), P::Unknown),
        (Some("HTTP2"), None, P::Http2),
        // Kubernetes' standard names.
        (Some("kubernetes.io/h2c"), Some("web"), P::Http2),
        (Some("kubernetes.io/ws"), Some("grpc"), P::Unknown),
        (Some("example.com/custom"), Some("grpc"), P::Unknown),
    ];
    for (app, name, want) in cases {
        assert_eq!(
            declared(*app, *name),
            *want,
            "appProtocol {app:?}, name {name:?}"
        );
    }
}

#[test]
fn http2_and_grpc_ports_are_sent_http2_and_every_other_http1() {
    assert_eq!(P::Http2.http_upstream(), HttpUpstream::Http2);
    assert_eq!(P::Grpc.http_upstream(), HttpUpstream::Http2);
    assert_eq!(P::Http11.http_upstream(), HttpUpstream::Http1);
    assert_eq!(P::Unknown.http_upstream(), HttpUpstream::Http1);
    assert_eq!(HttpUpstream::Http2.to_string(), "HTTP/2");
}

fn plan_to(class: Class) -> Plan {
    Plan {
        class,
        service: None,
        waypoint: None,
        landing: None,
        landing_port: 0,
        transport: Transport::Passthrough {
            connect_to: "198.18.0.1:1".parse().unwrap(),
        },
    }
}

#[test]
fn a_plan_is_sent_as_the_port_its_service_declares() {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net");
    let svc = m.service("api", &[("net", "198.18.100.1")], 80, 8080);
    svc.ports[0].app_protocol = P::Grpc;
    svc.ports.push(ServicePort::new(81, 8081));
    let key = svc.key();
    let snap = m.build();
    let to = |port| {
        plan_to(Class::Service {
            service: key.clone(),
            port,
        })
    };
    assert_eq!(http_upstream(&snap, &to(80)), HttpUpstream::Http2);
    assert_eq!(http_upstream(&snap, &to(81)), HttpUpstream::Http1);
    // A port the service does not list, a service that is gone, a workload: HTTP/1.1.
    assert_eq!(http_upstream(&snap, &to(82)), HttpUpstream::Http1);
    let gone = plan_to(Class::Service {
        service: ServiceKey::new("default", "gone.default.svc.cluster.local"),
        port: 80,
    });
    assert_eq!(http_upstream(&snap, &gone), HttpUpstream::Http1);
    let workload = plan_to(Class::Workload {
        workload: WorkloadUid::new("east//v1/Pod/default/x"),
        port: 80,
    });
    assert_eq!(http_upstream(&snap, &workload), HttpUpstream::Http1);
}
