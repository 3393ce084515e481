//! `ferry control` as a user runs it: serve the CA, issue node tokens, restart with the same root.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ferry_tls::ca_client::{CertificateSource, FetchError, GrpcCa};

mod common;

use common::{Killed, TempDir, example, ferry, output};

/// A running `ferry control serve`, killed when dropped.
struct Control {
    _child: Killed,
    addr: String,
    metrics: String,
}

fn serve(state: &Path) -> Control {
    let mut child = ferry()
        .args([
            "control",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--topology",
        ])
        .arg(example("two-clusters.yaml"))
        .arg("--state-dir")
        .arg(state)
        .stdout(Stdio::piped())
        .spawn()
        .expect("ferry control starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .expect("address printed")
        .to_string();
    let metrics = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("metrics address printed")
        .to_string();
    Control {
        _child: Killed(child),
        addr,
        metrics,
    }
}

async fn sign(cp: &Control, bundle: &str, token: &str, identity: &str) -> Result<(), FetchError> {
    let ca = GrpcCa::new(
        &format!("https://{}", cp.addr),
        bundle,
        "ferry-control",
        token.trim().to_string(),
        "east".into(),
    )?;
    ca.sign(&identity.parse().unwrap(), Duration::from_secs(3600))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn the_control_plane_signs_for_colocated_workloads_and_keeps_its_root_across_restarts() {
    let state =
        TempDir(std::env::temp_dir().join(format!("ferry-control-test-{}", std::process::id())));
    let cp = serve(&state.0);
    let bundle = output(&["control", "bundle"], &state.0);
    let token = output(&["control", "token", "--node", "east-1"], &state.0);
    assert!(
        !token.is_empty() && token.trim() == token,
        "a token is printed with nothing around it: {token:?}"
    );
    // sleep-east (service account `sleep`) runs on east-1.
    sign(
        &cp,
        &bundle,
        &token,
        "spiffe://cluster.local/ns/default/sa/sleep",
    )
    .await
    .expect("co-located workload");
    // search runs on west-2: east-1 may not have it.
    match sign(
        &cp,
        &bundle,
        &token,
        "spiffe://cluster.local/ns/default/sa/search",
    )
    .await
    {
        Err(FetchError::Refused(reason)) => assert!(reason.contains("runs on: west-2"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop(cp);
    let cp = serve(&state.0);
    assert_eq!(
        output(&["control", "bundle"], &state.0),
        bundle,
        "same trust root after a restart"
    );
    sign(
        &cp,
        &bundle,
        &token,
        "spiffe://cluster.local/ns/default/sa/sleep",
    )
    .await
    .expect("old token and bundle still work");
}

#[tokio::test]
async fn a_node_syncs_the_mesh_from_a_running_control_plane() {
    let state =
        TempDir(std::env::temp_dir().join(format!("ferry-control-xds-{}", std::process::id())));
    let cp = serve(&state.0);
    let bundle = output(&["control", "bundle"], &state.0);
    let token = output(&["control", "token", "--node", "east-1"], &state.0);
    let store = std::sync::Arc::new(ferry_core::store::Store::default());
    let client = ferry_xds::client::XdsClient::new(
        ferry_xds::client::ClientConfig {
            endpoint: format!("https://{}", cp.addr),
            bundle_pem: bundle,
            server_name: "ferry-control".into(),
            token: token.trim().to_string(),
            cluster: "east".into(),
            node_id: "ferry~east-1".into(),
            plaintext: false,
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
        },
        store.clone(),
    );
    let mut ready = client.ready();
    let task = tokio::spawn(client.run());
    tokio::time::timeout(Duration::from_secs(20), ready.wait_for(|r| *r))
        .await
        .expect("synced")
        .unwrap();
    let expected = ferry_topology::load_file(&example("two-clusters.yaml"))
        .unwrap()
        .snapshot;
    assert_eq!(
        store.load().workloads().count(),
        expected.workloads().count()
    );
    assert_eq!(store.load().services().count(), expected.services().count());
    task.abort();
    // The control plane exports what happened on the stream.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&cp.metrics).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.contains("ferry_xds_streams_total 1"), "{text}");
    assert!(text.contains("ferry_xds_acks_total"), "{text}");
}
