//! `ferry control serve --ui` and `ferry explain` on live state, on loopback (no lab, no root):
//! the mesh map drawn from the control plane's snapshot, explain on it, the records of a program
//! connected over xDS read from the admin address in its node metadata; `ferry explain
//! --control` against `ferry explain -t` on the same file; `ferry explain --conn` on a record
//! served by an admin endpoint.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{Killed, TempDir, ferry, output};

/// `examples/<name>`, as an argument.
fn example(name: &str) -> String {
    common::example(name).display().to_string()
}

/// A running `ferry control serve --ui`, killed when dropped.
struct Control {
    _child: Killed,
    /// The CA and xDS.
    addr: String,
    /// The mesh map.
    ui: SocketAddr,
}

/// `ferry control serve` on `topology` with the map on a free loopback port.
fn serve(state: &Path, topology: &str) -> Control {
    let mut child = ferry()
        .args([
            "control",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--ui",
            "127.0.0.1:0",
            "--topology",
            topology,
        ])
        .arg("--state-dir")
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ferry control starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut first, mut second) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut second).unwrap();
    let addr = first
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("address printed: {first:?}"))
        .to_string();
    let ui = second
        .trim()
        .strip_prefix("ferry control: serving the mesh map on http://")
        .and_then(|r| r.strip_suffix('/'))
        .unwrap_or_else(|| panic!("the map's address printed: {second:?}"))
        .parse()
        .unwrap();
    Control {
        _child: Killed(child),
        addr,
        ui,
    }
}

/// `GET path` on `addr`: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: map\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (status, body.to_string())
}

fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = get(addr, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A record as sleep-east's node proxy writes one for a connection to the echo service that
/// went straight to echo-east-1 (no waypoint in the record: a made-up but well-formed one).
fn record(id: &str) -> Value {
    serde_json::json!({
        "id": id,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "at_ms": 1_796_164_665_898u64,
        "direction": "outbound",
        "src_addr": "198.18.1.10:40000",
        "src_workload": "sleep-east",
        "src_identity": "spiffe://cluster.local/ns/default/sa/sleep",
        "src_cluster": "east",
        "dst_addr": "198.18.1.20:15008",
        "dst_hbone_addr": "198.18.1.20:8080",
        "dst_service": "default/echo.default.svc.cluster.local",
        "dst_workload": "east//v1/Pod/default/echo-east-1",
        "dst_identity": "spiffe://cluster.local/ns/default/sa/echo",
        "dst_cluster": "east",
        "path": "hbone to echo-east-1",
        "route": "service echo; picked echo-east-1; hbone",
        "verdict": "allowed",
        "policy": "",
        "rule": "",
        "response_flags": "-",
        "error": "",
        "bytes_sent": 6,
        "bytes_recv": 30,
        "duration_ms": 3,
        "decision_us": 12,
        "connect_us": 340,
        "tls_us": 1200,
        "first_byte_us": 2100,
    })
}

/// An admin endpoint that answers every request with `records` as JSON lines, on a thread,
/// for as long as the test runs.
fn admin_serving(records: &[Value]) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let body: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn the_control_plane_serves_the_mesh_map_of_its_own_mesh() {
    let state = TempDir::new("control-ui");
    let cp = serve(&state.0, &example("two-clusters.yaml"));
    let page = get(cp.ui, "/");
    assert_eq!(page.0, 200);
    assert!(page.1.contains("Ferry mesh map"), "{}", page.1);
    let mesh = get_json(cp.ui, "/api/mesh");
    let names = |k: &str| -> Vec<String> {
        mesh[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names("clusters"), ["east", "west"], "{mesh}");
    let service = |name: &str| {
        mesh["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no service {name}: {mesh}"))
            .clone()
    };
    assert_eq!(service("echo")["scope"], "global");
    assert_eq!(service("ledger")["scope"], "local");
    assert_eq!(names("gateways"), ["eastwest-east", "eastwest-west"]);
    // Explain on that same state: ledger is local, so east's source stays in east.
    let v = get_json(
        cp.ui,
        "/api/explain?from=east/default/sleep-east&to=198.18.10.2:80",
    );
    assert_eq!(v["refused"], false, "{v}");
    assert!(
        v["text"]
            .as_str()
            .unwrap()
            .contains("the control plane's current mesh"),
        "{v}"
    );
    let (status, body) = get(cp.ui, "/api/explain?from=nobody&to=198.18.10.2:80");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no such workload"), "{body}");
    // No program is connected yet: no records, nowhere to read them from.
    assert_eq!(get_json(cp.ui, "/api/records"), serde_json::json!([]));
    assert_eq!(get_json(cp.ui, "/api/sources"), serde_json::json!([]));
}

#[tokio::test]
async fn the_map_reads_records_from_the_admin_address_a_connected_node_gave() {
    let state = TempDir::new("control-ui-records");
    let cp = serve(&state.0, &example("two-clusters.yaml"));
    let bundle = output(&["control", "bundle"], &state.0);
    let token = output(&["control", "token", "--node", "east-1"], &state.0);
    let admin = admin_serving(&[record("1f-7")]);
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
        store,
    )
    .with_metadata(
        [(
            ferry_xds::client::ADMIN_ADDRESS_KEY.to_string(),
            admin.to_string(),
        )]
        .into_iter()
        .collect(),
    );
    let mut ready = client.ready();
    let task = tokio::spawn(client.run());
    tokio::time::timeout(Duration::from_secs(20), ready.wait_for(|r| *r))
        .await
        .expect("synced")
        .unwrap();
    let ui = cp.ui;
    let (sources, records) = tokio::task::spawn_blocking(move || {
        (get_json(ui, "/api/sources"), get_json(ui, "/api/records"))
    })
    .await
    .unwrap();
    assert_eq!(sources[0]["name"], "ferry~east-1", "{sources}");
    assert_eq!(
        sources[0]["node"], "east-1",
        "the node its credential proved"
    );
    assert_eq!(sources[0]["admin"], admin.to_string());
    assert_eq!(records[0]["id"], "1f-7", "{records}");
    assert_eq!(records[0]["component"], "ferry~east-1");
    assert_eq!(records[0]["hop"], 0, "an outbound record is the first hop");
    // Once its stream ends, the program is no longer listed.
    task.abort();
    let gone = tokio::task::spawn_blocking(move || {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if get_json(ui, "/api/sources") == serde_json::json!([]) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })
    .await
    .unwrap();
    assert!(gone, "a closed stream's program is still listed");
}

#[test]
fn the_map_is_served_on_loopback_unless_allowed_elsewhere() {
    let o = ferry()
        .args(["control", "serve", "-t", &example("two-clusters.yaml")])
        .args(["--ui", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("loopback only"), "{}", text(&o));
    assert!(text(&o).contains("--ui-allow-remote"), "{}", text(&o));
}

#[test]
fn explain_on_a_running_control_plane_matches_explain_on_its_file() {
    let state = TempDir::new("explain-control");
    let topology = example("two-clusters.yaml");
    let cp = serve(&state.0, &topology);
    let bundle = state.write("bundle.pem", &output(&["control", "bundle"], &state.0));
    let token = state.write(
        "token",
        &output(&["control", "token", "--node", "east-1"], &state.0),
    );
    let control = format!("https://{}", cp.addr);
    let live = |extra: &[&str]| {
        ferry()
            .args(["explain", "--control", &control, "--bundle-file", &bundle])
            .args(["--token-file", &token])
            .args(extra)
            .output()
            .unwrap()
    };
    for (from, to) in [
        (
            "east/default/sleep-east",
            "echo.default.svc.cluster.local:80",
        ),
        ("east/default/sleep-east", "198.18.10.2:80"),
        ("east/default/sleep-east", "198.18.10.4:80"),
        (
            "east/default/sleep-east",
            "search.default.svc.cluster.local:80",
        ),
        ("west/default/sleep-west", "198.19.10.2:80"),
    ] {
        let args = ["--from", from, "--to", to, "-o", "json"];
        let over_xds = live(&args);
        let from_file = ferry()
            .args(["explain", "-t", &topology])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            over_xds.status.code(),
            from_file.status.code(),
            "{}",
            text(&over_xds)
        );
        let a: Value = serde_json::from_slice(&over_xds.stdout).expect("JSON");
        let b: Value = serde_json::from_slice(&from_file.stdout).expect("JSON");
        assert_eq!(a, b, "{from} -> {to}: over xDS and from the file differ");
    }
    let o = live(&["--from", "sleep-east", "--to", "198.18.10.2:80"]);
    assert!(
        text(&o).contains(&format!("the control plane at {control}")),
        "{}",
        text(&o)
    );
    // Bad input is named, exit 2.
    let bad = state.write("bad-token", "not-a-token");
    let o = ferry()
        .args(["explain", "--control", &control, "--bundle-file", &bundle])
        .args([
            "--token-file",
            &bad,
            "--from",
            "sleep-east",
            "--to",
            "198.18.10.2:80",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("node credential"), "{}", text(&o));
    let o = ferry()
        .args([
            "explain",
            "--control",
            "127.0.0.1:1",
            "--bundle-file",
            &bundle,
        ])
        .args([
            "--token-file",
            &token,
            "--from",
            "sleep-east",
            "--to",
            "198.18.10.2:80",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("the control plane at https://127.0.0.1:1")
            && text(&o).contains("onnection refused"),
        "{}",
        text(&o)
    );
    let o = ferry()
        .args([
            "explain",
            "--control",
            &control,
            "--from",
            "a",
            "--to",
            "1.2.3.4:80",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("needs --bundle-file"), "{}", text(&o));
}

#[test]
fn explain_a_recorded_connection_read_from_an_admin_endpoint() {
    let admin = admin_serving(&[record("1f-6"), record("1f-7")]).to_string();
    let topology = example("two-clusters.yaml");
    let o = ferry()
        .args([
            "explain", "--conn", "1f-7", "--admin", &admin, "-t", &topology,
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    for part in [
        "connection 1f-7 as admin/",
        "route    service echo; picked echo-east-1; hbone",
        "timings  decision 12 us, connect 340 us, tls 1200 us, first byte 2100 us",
        "flags=- sent=6 recv=30",
        // The record's hops share its trace id.
        "the other hops of its trace",
        // The flow, derived: the source by its address, the service by its hostname and port.
        "--from east/default/sleep-east --to echo.default.svc.cluster.local:80",
    ] {
        assert!(out.contains(part), "no {part:?} in:\n{out}");
    }
    let o = ferry()
        .args([
            "explain", "--conn", "1f-7", "--admin", &admin, "-t", &topology,
        ])
        .args(["-o", "json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["record"]["id"], "1f-7");
    assert_eq!(v["explained"]["to"], "echo.default.svc.cluster.local:80");
    assert_eq!(v["explained"]["report"]["refused"], false, "{v}");
    // Without a state to explain on, the record alone.
    let o = ferry()
        .args(["explain", "--conn", "1f-7", "--admin", &admin])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("add --control URL or --topology FILE"));
    // A bad id names what was asked, exit 2.
    let o = ferry()
        .args(["explain", "--conn", "nope", "--admin", &admin])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("no connection record with id \"nope\"") && text(&o).contains("1f-7"),
        "{}",
        text(&o)
    );
    let o = ferry()
        .args(["explain", "--conn", "1f-7", "--admin", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("no admin endpoint answered"),
        "{}",
        text(&o)
    );
    let o = ferry()
        .args(["explain", "--conn", "1f-7"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--conn needs where to read records"));
}
