//! The waypoint's HBONE handler in process, over loopback sockets: a tunnel is answered only
//! once its upstream is connected, whether it carries it as bytes (a service whose endpoint is
//! a plain address) or inspects it (a workload it fronts, reached through its node proxy).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_core::model::{AddressEndpoint, NetworkAddress, PortMapping, WaypointFor};
use ferry_core::store::Store;
use ferry_core::testing::{MeshBuilder, waypoint_ref};
use ferry_hbone::headers::ConnectHeaders;
use ferry_hbone::pool::{Pool, PoolConfig};
use ferry_hbone::server::Server;
use ferry_hbone::settings::Settings;
use ferry_runtime::conn::ResponseFlag;
use ferry_tls::ca_client::{CertificateSource, FetchError};
use ferry_tls::certs::{CertManager, ManagerConfig};
use ferry_tls::config::Credentials;
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// The service `ext`, fronted by waypoint `wp`, whose one endpoint is `upstream` (no workload).
const EXT: &str = "198.18.100.1:80";

/// Signs with a test CA.
struct Signer(Arc<TestCa>);

impl CertificateSource for Signer {
    fn sign<'a>(
        &'a self,
        identity: &'a Identity,
        _lifetime: Duration,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Credentials, FetchError>> + Send + 'a>>
    {
        let creds = self.0.issue(identity);
        Box::pin(async move { Ok(creds) })
    }
}

/// A waypoint instance serving HBONE on loopback.
struct Fixture {
    addr: SocketAddr,
    identity: Identity,
    wp: Arc<Waypoint>,
    /// The mesh never changes here: held for the test's length.
    _changes: tokio::sync::watch::Sender<u64>,
}

/// A waypoint instance `wp-1` serving HBONE on loopback.
async fn waypoint(ca: &Arc<TestCa>, upstream: SocketAddr) -> Fixture {
    waypoint_in(ca, mesh(upstream, WaypointFor::Service, "198.18.1.50")).await
}

/// The mesh of [`waypoint`]: waypoint `wp` (serving `for_`, its instance at `wp_addr`) and
/// its service `ext`.
fn mesh(upstream: SocketAddr, for_: WaypointFor, wp_addr: &str) -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east");
    m.node("east-1", "east", "us-east/a/r1");
    m.waypoint("wp", for_);
    m.waypoint_pod("wp", "wp-1", "east-1", wp_addr);
    let ext = m.service("ext", &[("net-east", "198.18.100.1")], 80, upstream.port());
    ext.waypoint = Some(waypoint_ref("wp"));
    ext.address_endpoints = vec![AddressEndpoint {
        address: NetworkAddress::new("net-east".into(), upstream.ip()),
        cluster: "east".into(),
        ports: vec![PortMapping {
            service_port: 80,
            target_port: upstream.port(),
        }],
    }];
    m
}

/// Instance `wp-1` of `m`, serving HBONE on loopback.
async fn waypoint_in(ca: &Arc<TestCa>, m: MeshBuilder) -> Fixture {
    let snap = m.build();
    let me = snap
        .workloads()
        .find(|w| w.name == "wp-1")
        .expect("the waypoint pod")
        .clone();
    let identity = me.identity().unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let (_, drain) = ferry_runtime::drain::new();
    let (changes_tx, changes) = tokio::sync::watch::channel(0u64);
    let certs = CertManager::new(Arc::new(Signer(ca.clone())), ManagerConfig::default());
    let wp = Arc::new_cyclic(|this| Waypoint {
        store: Arc::new(Store::new(snap)),
        certs,
        pool: Pool::new(PoolConfig::default()),
        bundle: ca.bundle(),
        uid: me.uid.clone(),
        identity: identity.clone(),
        addresses: me.addresses.clone(),
        cluster: me.cluster.clone(),
        network: me.network.clone(),
        metrics: Arc::new(crate::metrics::RequestMetrics::new(&mut registry)),
        netns: None,
        changes,
        finish: drain.finish_signal(),
        acceptor: Arc::new(ferry_runtime::accept::Acceptor::new(&mut registry)),
        this: this.clone(),
    });
    let server = Server::new(&ca.issue(&identity), &ca.bundle(), Settings::default()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::new(server).serve(listener, wp.clone()));
    Fixture {
        addr,
        identity,
        wp,
        _changes: changes_tx,
    }
}

/// A loopback port nothing listens on, and the socket that holds it (bound, not listening: a
/// connection to it is refused), so that no socket of a test running alongside is given it.
fn dead_port() -> (SocketAddr, tokio::net::TcpSocket) {
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (held.local_addr().unwrap(), held)
}

/// Opens a CONNECT to `EXT` through the waypoint at `to`, as `sleep`.
async fn connect(
    ca: &TestCa,
    to: SocketAddr,
    wp: &Identity,
) -> Result<ferry_hbone::stream::H2Stream, HboneError> {
    connect_to(ca, to, wp, EXT).await
}

/// Opens a CONNECT to `target` through the waypoint at `to`, as `sleep`.
async fn connect_to(
    ca: &TestCa,
    to: SocketAddr,
    wp: &Identity,
    target: &str,
) -> Result<ferry_hbone::stream::H2Stream, HboneError> {
    let creds = ca.issue_str("spiffe://cluster.local/ns/default/sa/sleep");
    let conn = ferry_hbone::client::Connection::connect(
        &ferry_hbone::client::DirectDialer,
        None,
        to,
        &creds,
        &ca.bundle(),
        vec![wp.clone()],
        &Settings::default(),
    )
    .await
    .unwrap();
    conn.open(target, &ConnectHeaders::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_carried_as_bytes_is_answered_503_when_its_upstream_cannot_be_reached() {
    let ca = Arc::new(TestCa::new("root"));
    let (dead, _held) = dead_port();
    let f = waypoint(&ca, dead).await;
    let refused = connect(&ca, f.addr, &f.identity).await;
    assert!(
        matches!(refused, Err(HboneError::Refused { status: 503, .. })),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_carried_as_bytes_is_answered_200_once_its_upstream_is_connected() {
    let ca = Arc::new(TestCa::new("root"));
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let f = waypoint(&ca, upstream.local_addr().unwrap()).await;
    let mut tunnel = connect(&ca, f.addr, &f.identity)
        .await
        .expect("the tunnel is open");
    // Already connected when the 200 came: the connection waits in the listener's queue (read
    // straight from the kernel, without waiting).
    let upstream = upstream.into_std().unwrap();
    upstream.set_nonblocking(true).unwrap();
    let (app, _) = upstream
        .accept()
        .expect("the upstream was connected before the 200");
    app.set_nonblocking(true).unwrap();
    let mut app = tokio::net::TcpStream::from_std(app).unwrap();
    tunnel.write_all(b"hello").await.unwrap();
    let mut got = [0u8; 5];
    app.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello");
}

/// A mesh whose waypoint (instance on 127.0.0.1: its tunnels onward are dialled from there)
/// fronts the workload `app` at `app_addr` too.
fn fronting(app_addr: &str) -> MeshBuilder {
    let mut m = mesh(
        "127.0.0.1:9".parse().unwrap(),
        WaypointFor::All,
        "127.0.0.1",
    );
    m.pod("app", "east-1", app_addr).waypoint = Some(waypoint_ref("wp"));
    m
}

/// A workload the waypoint fronts, on a loopback address whose node proxy (its HBONE port)
/// is down. The waypoint inspects what such a tunnel carries (HTTP or not), yet it dials the
/// destination before it answers: the client gets the failure, never a `200` for a tunnel that
/// goes nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_to_a_workload_whose_destination_is_down_is_refused_not_answered_200() {
    const APP: &str = "127.0.0.2:8080";
    let ca = Arc::new(TestCa::new("root"));
    let f = waypoint_in(&ca, fronting("127.0.0.2")).await;
    let refused = connect_to(&ca, f.addr, &f.identity, APP).await;
    assert!(
        matches!(refused, Err(HboneError::Refused { status: 503, .. })),
        "{refused:?}"
    );
    // And why, for the access log: the destination could not be reached.
    let req = ConnectRequest {
        trace_id: None,
        id: 2,
        peer: Arc::new(
            "spiffe://cluster.local/ns/default/sa/sleep"
                .parse()
                .unwrap(),
        ),
        peer_addr: "127.0.0.1:40000".parse().unwrap(),
        peer_cluster: Arc::new(ferry_core::hop::PeerCluster::Proven("east".into())),
        target: ferry_hbone::headers::Target::Addr(APP.parse().unwrap()),
        headers: http::HeaderMap::new(),
    };
    let mut admitted = f.wp.admit(&req).expect("admitted");
    assert!(f.wp.connect(&req, &mut admitted).await.is_err());
    let e = admitted.error.as_deref().expect("the failure is kept");
    assert_eq!(e.side, Side::Upstream, "{e}");
    assert_eq!(e.flag, ResponseFlag::ConnectionFailure, "{e}");
    assert!(e.to_string().contains("127.0.0.2:15008"), "{e}");
}

/// Counts the CONNECTs a destination's node proxy got (each then goes to its target over TCP).
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl ferry_hbone::server::Handler for Counting {
    type Admit = ();

    fn admit(&self, _: &ConnectRequest) -> Result<(), ferry_hbone::headers::Refusal> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// The same workload with its destination up: the destination already has the tunnel when the
/// client gets its `200`, and the client's HTTP request then goes through that same tunnel
/// (one CONNECT at the destination, not one for the answer and another for the request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_to_a_workload_is_answered_once_its_destination_has_it_and_http_uses_that() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let ca = Arc::new(TestCa::new("root"));
    let f = waypoint_in(&ca, fronting("127.0.0.3")).await;
    // The app: one HTTP/1.1 answer per request.
    let app = TcpListener::bind("127.0.0.3:0").await.unwrap();
    let app_addr = app.local_addr().unwrap().to_string();
    let app_addr = app_addr.as_str();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = app.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    // Its node proxy: HBONE on 127.0.0.3:15008 with the app's certificate.
    let connects = Arc::new(AtomicUsize::new(0));
    let app_id: Identity = "spiffe://cluster.local/ns/default/sa/app".parse().unwrap();
    let node = Server::new(&ca.issue(&app_id), &ca.bundle(), Settings::default()).unwrap();
    let hbone = TcpListener::bind("127.0.0.3:15008")
        .await
        .expect("127.0.0.3:15008 is free");
    tokio::spawn(Arc::new(node).serve(hbone, Arc::new(Counting(connects.clone()))));
    let mut tunnel = connect_to(&ca, f.addr, &f.identity, app_addr)
        .await
        .expect("answered 200");
    assert_eq!(
        connects.load(Ordering::SeqCst),
        1,
        "the destination had the tunnel before the 200"
    );
    tunnel
        .write_all(b"GET / HTTP/1.1\r\nhost: app\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !got.ends_with(b"ok") {
        let mut b = [0u8; 1024];
        let n = tokio::time::timeout_at(deadline, tunnel.read(&mut b))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "ended early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
    assert_eq!(
        connects.load(Ordering::SeqCst),
        1,
        "the request went through the tunnel dialled before the 200"
    );
}

#[tokio::test]
async fn a_failed_upstream_connect_is_kept_for_the_access_log_as_the_upstream_side_s() {
    let ca = Arc::new(TestCa::new("root"));
    let (dead, _held) = dead_port();
    let f = waypoint(&ca, dead).await;
    let req = ConnectRequest {
        trace_id: None,
        id: 1,
        peer: Arc::new(
            "spiffe://cluster.local/ns/default/sa/sleep"
                .parse()
                .unwrap(),
        ),
        peer_addr: "127.0.0.1:40000".parse().unwrap(),
        peer_cluster: Arc::new(ferry_core::hop::PeerCluster::Proven("east".into())),
        target: ferry_hbone::headers::Target::Addr(EXT.parse().unwrap()),
        headers: http::HeaderMap::new(),
    };
    let mut admitted = f.wp.admit(&req).expect("admitted");
    let refused = f.wp.connect(&req, &mut admitted).await;
    assert!(
        matches!(&refused, Err(r) if r.status() == 503),
        "{refused:?}"
    );
    // What `finished` writes to the access log (error.side, response_flags).
    let e = admitted.error.as_deref().expect("the failure is kept");
    assert_eq!(e.side, Side::Upstream, "{e}");
    assert_eq!(e.flag, ResponseFlag::ConnectionFailure, "{e}");
    assert!(
        matches!(&e.kind, ConnErrorKind::Connect { addr, .. } if *addr == dead),
        "{e}"
    );
}

#[test]
fn a_tunnel_onward_continues_the_trace_and_names_its_service_as_a_node_proxy_does() {
    let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string();
    let onward = Onward {
        baggage: vec![("k8s.cluster.name".into(), "east".into())],
        traceparent: Some(trace.clone()),
    };
    let peer: SocketAddr = "198.18.1.10:40000".parse().unwrap();
    let h = tunnel_headers(
        onward.clone(),
        Some(peer),
        Some("echo.default.svc.cluster.local".into()),
    );
    assert_eq!(h.traceparent.as_deref(), Some(trace.as_str()));
    assert_eq!(
        h.forwarded_host.as_deref(),
        Some("echo.default.svc.cluster.local")
    );
    assert_eq!(h.forwarded_for, Some(peer));
    // Written and read back as the destination reads them.
    let mut map = http::HeaderMap::new();
    h.write(&mut map);
    let back = ConnectHeaders::read(&map);
    assert_eq!(back.traceparent.as_deref(), Some(trace.as_str()));
    assert_eq!(
        back.forwarded_host.as_deref(),
        Some("echo.default.svc.cluster.local")
    );
    // A pod address: no service to name.
    assert_eq!(
        tunnel_headers(onward.clone(), Some(peer), None).forwarded_host,
        None
    );
    // An unproven client: none forwarded, the service still named.
    let h = tunnel_headers(onward, None, Some("echo.default.svc.cluster.local".into()));
    let mut map = http::HeaderMap::new();
    h.write(&mut map);
    let back = ConnectHeaders::read(&map);
    assert_eq!(back.forwarded_for, None);
    assert_eq!(
        back.forwarded_host.as_deref(),
        Some("echo.default.svc.cluster.local")
    );
}

/// A gRPC call through the waypoint to a service whose port says `grpc`: the waypoint speaks
/// HTTP/2 to the pod (a real tonic server behind its node proxy), and the call's status and
/// trailers come back intact, for an answer (data, then `grpc-status: 0` in trailers) and for
/// an error (trailers only: `grpc-status: 5` with its `grpc-message`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_through_the_waypoint_returns_its_status_and_trailers() {
    use ferry_core::model::AppProtocol;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    const APP_IP: &str = "127.0.0.5";
    const VIP: &str = "198.18.100.2:82";
    let ca = Arc::new(TestCa::new("root"));
    // The app: grpc.health.v1 (HTTP/2 only), "lab.echo" serving.
    let app = TcpListener::bind((APP_IP, 0))
        .await
        .expect("127.0.0.5 is free");
    let app_port = app.local_addr().unwrap().port();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("lab.echo", tonic_health::ServingStatus::Serving)
        .await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(app)),
    );
    // Its node proxy: HBONE on 127.0.0.5:15008, on to the app over TCP.
    let connects = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app_id: Identity = "spiffe://cluster.local/ns/default/sa/app".parse().unwrap();
    let node = Server::new(&ca.issue(&app_id), &ca.bundle(), Settings::default()).unwrap();
    let hbone = TcpListener::bind((APP_IP, 15008))
        .await
        .expect("127.0.0.5:15008 is free");
    tokio::spawn(Arc::new(node).serve(hbone, Arc::new(Counting(connects.clone()))));
    // The service `health` on VIP:82, its port named grpc, served by the waypoint.
    let mut m = mesh(
        "127.0.0.1:9".parse().unwrap(),
        WaypointFor::All,
        "127.0.0.1",
    );
    m.pod("app", "east-1", APP_IP);
    let svc = m.service("health", &[("net-east", "198.18.100.2")], 82, app_port);
    svc.ports[0].app_protocol = AppProtocol::Grpc;
    svc.waypoint = Some(waypoint_ref("wp"));
    m.backs("app", "health");
    let f = waypoint_in(&ca, m).await;
    // The client: gRPC (HTTP/2) inside a tunnel to the VIP through the waypoint.
    let tunnel = connect_to(&ca, f.addr, &f.identity, VIP)
        .await
        .expect("answered 200");
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tunnel),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let channel = tower::service_fn(move |req: http::Request<tonic::body::Body>| {
        let mut sender = sender.clone();
        async move { sender.send_request(req).await }
    });
    let origin = http::Uri::from_static("http://health.default.svc.cluster.local:82");
    let mut client = HealthClient::with_origin(channel, origin);
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    // Known: SERVING, and grpc-status 0 came in the trailers (tonic merges them into the
    // metadata; without them the call fails as a protocol violation).
    let ok = client
        .check(check("lab.echo"))
        .await
        .expect("a SERVING answer");
    assert_eq!(ok.get_ref().status, ServingStatus::Serving as i32);
    assert_eq!(
        ok.metadata()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap()),
        Some("0"),
        "{:?}",
        ok.metadata()
    );
    // Unknown: NOT_FOUND, trailers only, its message intact.
    let err = client
        .check(check("no.such.Service"))
        .await
        .expect_err("not found");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert_eq!(err.message(), "service not registered", "{err:?}");
    // Through the one tunnel the waypoint dialled for the connection.
    assert_eq!(
        connects.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the calls went on in the tunnel dialled before the 200"
    );
    assert_eq!(f.wp.metrics.requests_with(200), 2);
}
