//! Double HBONE through a gateway that forwards the inner bytes without reading them.

mod common;

use std::sync::Arc;

use common::*;
use ferry_core::hop::PeerCluster;
use ferry_core::model::ClusterId;
use ferry_hbone::double::open_inner;
use ferry_hbone::headers::{ConnectHeaders, Refusal, Target};
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey};
use ferry_hbone::server::{ConnectRequest, Handler};
use ferry_hbone::settings::Settings;
use ferry_hbone::upstream::Forward;
use ferry_tls::testkit::TestCa;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GATEWAY: &str = "spiffe://cluster.local/ns/istio-system/sa/eastwest";

/// A gateway: hostname targets only, forwarded as raw bytes to one HBONE address.
struct Gateway {
    next_hop: std::net::SocketAddr,
    seen: Mutex<Vec<(String, String)>>,
    clusters: Mutex<Vec<PeerCluster>>,
}

impl Handler for Gateway {
    type Admit = ();

    fn admit(&self, req: &ConnectRequest) -> Result<(), Refusal> {
        match &req.target {
            Target::Host { .. } => {
                self.clusters.lock().push((*req.peer_cluster).clone());
                self.seen
                    .lock()
                    .push((req.peer.to_string(), req.target.to_string()));
                Ok(())
            }
            Target::Addr(_) => Err(Refusal::BadRequest(
                "a gateway serves service hostnames only".into(),
            )),
        }
    }

    fn connect(
        &self,
        _req: &ConnectRequest,
        _admitted: &mut (),
    ) -> impl std::future::Future<Output = Result<Forward, Refusal>> + Send {
        let to = self.next_hop;
        async move {
            tokio::net::TcpStream::connect(to)
                .await
                .map(Forward::from)
                .map_err(|e| Refusal::Unavailable(e.to_string()))
        }
    }
}

/// The destination: resolves the hostname target to the echo server.
struct Destination {
    echo: std::net::SocketAddr,
    seen: Mutex<Vec<(String, String, Option<String>)>>,
    clusters: Mutex<Vec<PeerCluster>>,
}

impl Handler for Destination {
    type Admit = ();

    fn admit(&self, req: &ConnectRequest) -> Result<(), Refusal> {
        let h = ConnectHeaders::read(&req.headers);
        self.clusters.lock().push((*req.peer_cluster).clone());
        self.seen.lock().push((
            req.peer.to_string(),
            req.target.to_string(),
            h.forwarded_network,
        ));
        Ok(())
    }

    fn connect(
        &self,
        _req: &ConnectRequest,
        _admitted: &mut (),
    ) -> impl std::future::Future<Output = Result<Forward, Refusal>> + Send {
        let to = self.echo;
        async move {
            tokio::net::TcpStream::connect(to)
                .await
                .map(Forward::from)
                .map_err(|e| Refusal::Unavailable(e.to_string()))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_destination_sees_the_original_identity_through_the_gateway() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let dest = Arc::new(Destination {
        echo,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let dest_addr = hbone_server(&ca, SERVER, dest.clone(), Settings::default()).await;
    let gw = Arc::new(Gateway {
        next_hop: dest_addr,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let gw_addr = hbone_server(&ca, GATEWAY, gw.clone(), Settings::default()).await;

    let pool = Pool::new(PoolConfig::default());
    let creds = ca.issue_str(CLIENT);
    let authority = "echo.default.svc.cluster.local:80";
    let key = PoolKey::new(
        id(CLIENT),
        "127.0.0.1".parse().unwrap(),
        gw_addr,
        vec![id(GATEWAY)],
    );
    let outer = pool
        .open(
            &key,
            &creds,
            &ca.bundle(),
            authority,
            &ConnectHeaders::default(),
        )
        .await
        .expect("outer tunnel");
    let headers = ConnectHeaders {
        forwarded_network: Some("net-east".into()),
        ..ConnectHeaders::default()
    };
    let mut inner = open_inner(
        outer,
        gw_addr,
        &creds,
        &ca.bundle(),
        vec![id(SERVER)],
        authority,
        &headers,
        &Settings::default(),
    )
    .await
    .expect("inner tunnel");
    inner.write_all(b"across networks").await.unwrap();
    inner.shutdown().await.unwrap();
    let mut back = Vec::new();
    inner.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"across networks");
    assert_eq!(
        gw.seen.lock()[0],
        (CLIENT.to_string(), authority.to_string()),
        "the gateway checks the caller"
    );
    let seen = dest.seen.lock()[0].clone();
    assert_eq!(
        seen.0, CLIENT,
        "the destination sees the original identity, not the gateway's"
    );
    assert_eq!(seen.1, authority);
    assert_eq!(seen.2.as_deref(), Some("net-east"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inner_handshake_checks_the_destination_identity() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let dest = Arc::new(Destination {
        echo,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let dest_addr = hbone_server(&ca, SERVER, dest.clone(), Settings::default()).await;
    let gw = Arc::new(Gateway {
        next_hop: dest_addr,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let gw_addr = hbone_server(&ca, GATEWAY, gw.clone(), Settings::default()).await;
    let pool = Pool::new(PoolConfig::default());
    let creds = ca.issue_str(CLIENT);
    let key = PoolKey::new(
        id(CLIENT),
        "127.0.0.1".parse().unwrap(),
        gw_addr,
        vec![id(GATEWAY)],
    );
    let outer = pool
        .open(
            &key,
            &creds,
            &ca.bundle(),
            "x.default.svc:80",
            &ConnectHeaders::default(),
        )
        .await
        .unwrap();
    let wanted = "spiffe://cluster.local/ns/default/sa/someone-else";
    let err = open_inner(
        outer,
        gw_addr,
        &creds,
        &ca.bundle(),
        vec![id(wanted)],
        "x.default.svc:80",
        &ConnectHeaders::default(),
        &Settings::default(),
    )
    .await
    .expect_err("an impostor behind the gateway is refused");
    assert!(err.to_string().contains(wanted), "{err}");
    assert!(dest.seen.lock().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inner_connection_detects_a_vanished_destination_by_ping() {
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let dest = Arc::new(Destination {
        echo,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let dest_addr = hbone_server(&ca, SERVER, dest.clone(), Settings::default()).await;
    // Between the gateway and the destination: a path that can go silent without a FIN or RST.
    let (relay, frozen) = freezable_relay(dest_addr).await;
    let gw = Arc::new(Gateway {
        next_hop: relay,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let gw_addr = hbone_server(&ca, GATEWAY, gw.clone(), Settings::default()).await;
    let pool = Pool::new(PoolConfig::default());
    let creds = ca.issue_str(CLIENT);
    let authority = "echo.default.svc.cluster.local:80";
    let key = PoolKey::new(
        id(CLIENT),
        "127.0.0.1".parse().unwrap(),
        gw_addr,
        vec![id(GATEWAY)],
    );
    let outer = pool
        .open(
            &key,
            &creds,
            &ca.bundle(),
            authority,
            &ConnectHeaders::default(),
        )
        .await
        .expect("outer tunnel");
    let settings = Settings {
        ping_interval: Duration::from_millis(100),
        // Wide enough that a loaded machine does not time out a PING before the echo.
        ping_timeout: Duration::from_secs(2),
        ..Settings::default()
    };
    let mut inner = open_inner(
        outer,
        gw_addr,
        &creds,
        &ca.bundle(),
        vec![id(SERVER)],
        authority,
        &ConnectHeaders::default(),
        &settings,
    )
    .await
    .expect("inner tunnel");
    inner.write_all(b"hi").await.unwrap();
    let mut b = [0u8; 2];
    inner.read_exact(&mut b).await.unwrap();
    frozen.store(true, Ordering::SeqCst);
    // The outer connection (to the gateway) is healthy; only the inner one's PINGs can tell.
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), inner.read_to_end(&mut rest))
        .await
        .expect("the inner connection notices the silent destination by PING, not hang");
    assert!(r.is_err(), "the inner tunnel fails: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hop_learns_the_cluster_its_own_peer_certificate_proves() {
    // The outer tunnel under a certificate proving "outer", the inner one under a certificate
    // proving "east": the gateway is told "outer", the destination "east" (the inner
    // tunnel's certificate decides there, whatever the outer one said).
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let dest = Arc::new(Destination {
        echo,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let dest_addr = hbone_server(&ca, SERVER, dest.clone(), Settings::default()).await;
    let gw = Arc::new(Gateway {
        next_hop: dest_addr,
        seen: Mutex::new(Vec::new()),
        clusters: Mutex::default(),
    });
    let gw_addr = hbone_server(&ca, GATEWAY, gw.clone(), Settings::default()).await;
    let outer_creds = ca.issue_in(&id(CLIENT), &ClusterId::new("outer"));
    let inner_creds = ca.issue_in(&id(CLIENT), &ClusterId::new("east"));
    let authority = "echo.default.svc.cluster.local:80";
    let pool = Pool::new(PoolConfig::default());
    let key = PoolKey::new(
        id(CLIENT),
        "127.0.0.1".parse().unwrap(),
        gw_addr,
        vec![id(GATEWAY)],
    );
    let outer = pool
        .open(
            &key,
            &outer_creds,
            &ca.bundle(),
            authority,
            &ConnectHeaders::default(),
        )
        .await
        .expect("outer tunnel");
    let mut inner = open_inner(
        outer,
        gw_addr,
        &inner_creds,
        &ca.bundle(),
        vec![id(SERVER)],
        authority,
        &ConnectHeaders::default(),
        &Settings::default(),
    )
    .await
    .expect("inner tunnel");
    inner.write_all(b"x").await.unwrap();
    inner.shutdown().await.unwrap();
    let mut back = Vec::new();
    inner.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"x");
    assert_eq!(
        *gw.clusters.lock(),
        [PeerCluster::Proven(ClusterId::new("outer"))]
    );
    assert_eq!(
        *dest.clusters.lock(),
        [PeerCluster::Proven(ClusterId::new("east"))]
    );
}
