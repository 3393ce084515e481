//! What a Kubernetes Service port says it speaks, its `appProtocol` or else its name, reaches
//! the mesh as Istio reads it: a waypoint then speaks HTTP/2 to `http2` and `grpc` ports.

mod support;

use ferry_core::model::{AppProtocol, ServiceKey};

#[test]
fn a_service_port_s_app_protocol_or_name_says_what_it_speaks() {
    let api = "apiVersion: v1
kind: Service
metadata: {name: api, namespace: default}
spec:
  clusterIP: 198.18.11.90
  selector: {app: api}
  ports:
    - {name: grpc-health, port: 82, targetPort: 50051}
    - {name: web, port: 83, targetPort: 8083, appProtocol: kubernetes.io/h2c}
    - {name: grpc, port: 84, targetPort: 8084, appProtocol: http}
    - {name: db, port: 85, targetPort: 5432}
    - {port: 86, targetPort: 8086, appProtocol: HTTP2}
";
    let (snap, notes) = support::mesh(api, "");
    let svc = snap
        .service(&ServiceKey::new("default", "api.default.svc.cluster.local"))
        .unwrap_or_else(|| panic!("the service, notes: {notes:?}"));
    let got: Vec<(u16, AppProtocol)> = svc.ports.iter().map(|p| (p.port, p.app_protocol)).collect();
    assert_eq!(
        got,
        [
            (82, AppProtocol::Grpc),
            (83, AppProtocol::Http2),
            (84, AppProtocol::Http11),
            (85, AppProtocol::Unknown),
            (86, AppProtocol::Http2),
        ]
    );
}
