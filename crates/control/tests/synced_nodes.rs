//! What a synced node costs `ferry control` in memory: after its initial sync, a connected node
//! must not keep a buffer the size of what it was sent (tonic's encoder kept each stream's
//! largest message, about 32 MiB per node at 100,000 workloads).
//!
//! The nodes are bare HTTP/2 clients over TLS (h2 + rustls) that subscribe as a node proxy
//! does and count the gRPC messages they receive without keeping them, so the live heap of this
//! process is the server's plus a few small connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use ferry_api::discovery::{DeltaDiscoveryRequest, Node};
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_control::testing::Counting;
use ferry_control::testing::control::Control;
use tokio::time::Instant;

#[global_allocator]
static GLOBAL: Counting = Counting;

fn mib(b: isize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Live heap once it has stopped moving (what other tasks free settles).
async fn settled_heap() -> isize {
    // Quiet for three samples in a row: a task held back on a loaded machine may still be
    // freeing what it held after one.
    let mut last = Counting::live();
    let mut quiet = 0;
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Counting::live();
        quiet = if (now - last).abs() < 32 << 10 {
            quiet + 1
        } else {
            0
        };
        if quiet == 3 || Instant::now() > end {
            return now;
        }
        last = now;
    }
}

/// A node connected over TLS and HTTP/2 that reads everything and keeps nothing.
struct BareNode {
    /// Whole gRPC messages received.
    messages: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BareNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gRPC message: the uncompressed flag and the length, then the encoding.
fn framed(m: &impl prost::Message) -> Bytes {
    let body = m.encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.into()
}

impl BareNode {
    async fn connect(control: &Control, node: &str) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        let bundle = control.bundle().unwrap();
        for cert in rustls_pemfile::certs(&mut bundle.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = tokio::net::TcpStream::connect(control.listening.addr)
            .await
            .unwrap();
        let name = rustls_pki_types::ServerName::try_from(ferry_control::app::SERVER_NAME).unwrap();
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, tcp)
            .await
            .expect("the TLS handshake with the control plane");
        let (mut h2, conn) = h2::client::handshake(stream).await.unwrap();
        let token = control.token(node).unwrap();
        let request = http::Request::post(format!(
            "https://{}{}",
            ferry_control::app::SERVER_NAME,
            ferry_control::xds_server::DELTA_PATH
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap();
        let (response, mut send) = h2.send_request(request, false).unwrap();
        for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
            let subscribe = DeltaDiscoveryRequest {
                node: Some(Node {
                    id: format!("ferry~{node}"),
                    cluster: "east".into(),
                    metadata: None,
                }),
                type_url: type_url.into(),
                resource_names_subscribe: vec!["*".into()],
                ..Default::default()
            };
            send.send_data(framed(&subscribe), false).unwrap();
        }
        let messages = Arc::new(AtomicUsize::new(0));
        let counted = messages.clone();
        let task = tokio::spawn(async move {
            let _conn = tokio::spawn(conn);
            let _send = send;
            let Ok(response) = response.await else {
                return;
            };
            let mut body = response.into_body();
            // Bytes of the current message still to come; `None` between messages.
            let mut header: Vec<u8> = Vec::new();
            let mut left: usize = 0;
            while let Some(Ok(mut data)) = body.data().await {
                let _ = body.flow_control().release_capacity(data.len());
                while data.has_remaining() {
                    if left == 0 {
                        header.push(data.get_u8());
                        if header.len() == 5 {
                            left = u32::from_be_bytes([header[1], header[2], header[3], header[4]])
                                as usize;
                            header.clear();
                            if left == 0 {
                                counted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        continue;
                    }
                    let n = left.min(data.remaining());
                    data.advance(n);
                    left -= n;
                    if left == 0 {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        Self { messages, task }
    }

    /// Polls until both types' initial pushes have arrived whole.
    async fn synced(&self) {
        let end = Instant::now() + Duration::from_secs(60);
        while self.messages.load(Ordering::Relaxed) < 2 {
            assert!(
                Instant::now() < end,
                "timed out waiting for a node's initial sync"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synced_node_costs_the_server_far_less_than_its_initial_push() {
    let workloads = 10_000;
    let text = ferry_control::testing::generated_topology(workloads, workloads / 20, 0);
    let set = {
        let topology = ferry_topology::parse("generated", &text).expect("the generated topology");
        ferry_control::flatten::resource_set(&topology.snapshot)
    };
    // What a node that holds nothing is sent.
    let initial: usize = set
        .by_type
        .values()
        .flat_map(|t| t.values())
        .map(|v| v.body.len())
        .sum();
    drop(set);
    assert!(initial > 2 << 20, "the mesh is only {initial} bytes");
    let control = Control::start("synced-nodes", &text).await.unwrap();

    // The first node warms the server up (runtime, TLS, HTTP/2, the shared initial difference).
    let first = BareNode::connect(&control, "node0").await;
    first.synced().await;
    let base = settled_heap().await;
    let count = 8;
    let mut nodes = Vec::new();
    for i in 1..=count {
        let node = BareNode::connect(&control, &format!("node{i}")).await;
        node.synced().await;
        nodes.push(node);
    }
    let bound = (initial / 8) as isize;
    // Measured again until within the bound, for a while: what is still in flight goes.
    let end = Instant::now() + Duration::from_secs(30);
    let mut after = settled_heap().await;
    while (after - base) / count > bound && Instant::now() < end {
        after = settled_heap().await;
    }
    let per_node = (after - base) / count;
    println!(
        "initial push {:.2} MiB; live heap {:.1} -> {:.1} MiB with {count} more synced nodes: {:.1} KiB per node",
        mib(initial as isize),
        mib(base),
        mib(after),
        per_node as f64 / 1024.0
    );
    assert!(
        per_node <= bound,
        "each synced node costs {:.2} MiB of live heap (initial push {:.2} MiB; bound {:.2} MiB)",
        mib(per_node),
        mib(initial as isize),
        mib(bound)
    );
    drop(nodes);
    drop(first);
}
