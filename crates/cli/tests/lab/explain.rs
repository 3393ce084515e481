//! `ferry explain` on live state in the lab: on the mesh the running control plane serves over
//! xDS (read from a node's namespace, with that node's credential), against `--lab` (its
//! topology file); and on a connection the data path carried, by the id of its record.

use std::process::Output;

use serde_json::Value;

use crate::harness::{MESH, ferry};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> Value {
    assert!(
        o.status.code() == Some(0) || o.status.code() == Some(3),
        "{}",
        text(o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// The same flow, explained on the control plane's mesh over xDS and on the lab's topology file,
/// gives the same report.
#[test]
fn explain_on_the_control_planes_mesh_matches_explain_on_the_lab() {
    let Some(lab) = MESH.get() else { return };
    let dir = lab.dir.display().to_string();
    let control = format!("https://{}", lab.state(&["control_addr"]).as_str().unwrap());
    let over_xds = |from: &str, to: &str| {
        // The control plane is on the management network: ask from a node's namespace.
        ferry()
            .args([
                "lab",
                "exec",
                "alpha-1",
                "--state-dir",
                &dir,
                "--id",
                &lab.id,
            ])
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args(["explain", "--control", &control])
            .args(["--bundle-file", &format!("{dir}/bundle.pem")])
            .args(["--token-file", &format!("{dir}/alpha-1.token")])
            .args(["--from", from, "--to", to, "-o", "json"])
            .output()
            .unwrap()
    };
    let on_lab = |from: &str, to: &str| {
        ferry()
            .args(["explain", "--lab", "--state-dir", &dir])
            .args(["--from", from, "--to", to, "-o", "json"])
            .output()
            .unwrap()
    };
    for (from, to) in [
        ("sleep", "198.18.10.1:80"),
        ("sleep", "198.18.10.2:80"),
        ("sleep", "198.18.10.4:80"),
        // Refused: audit's only healthy waypoint instance is in beta, audit is local.
        ("sleep", "198.18.10.5:81"),
    ] {
        let (a, b) = (over_xds(from, to), on_lab(from, to));
        assert_eq!(a.status.code(), b.status.code(), "{}", text(&a));
        assert_eq!(
            json(&a),
            json(&b),
            "{from} -> {to}: xDS and the file differ"
        );
    }
    // Unreachable from here (the host has no route to the management network): named, exit 2.
    let o = ferry()
        .args(["explain", "--control", &control])
        .args(["--bundle-file", &format!("{dir}/bundle.pem")])
        .args(["--token-file", &format!("{dir}/alpha-1.token")])
        .args([
            "--from",
            "sleep",
            "--to",
            "198.18.10.1:80",
            "--sync-timeout",
            "3",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(&control), "{}", text(&o));
}

/// A connection through the echo service: its source hop's record and the explanation of the
/// flow derived from it; a later hop's id leads to the same flow; a bad id is named.
#[test]
fn explain_a_connection_by_its_record_id() {
    let Some(lab) = MESH.get() else { return };
    let dir = lab.dir.display().to_string();
    let out = lab.trace("sleep", "198.18.10.1:80", "json");
    let traced: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let hops = traced["hops"].as_array().expect("hops");
    let first = hops[0]["id"].as_str().unwrap().to_string();
    let last = hops.last().unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(hops[0]["direction"], "outbound", "{traced}");
    let explain = |id: &str, output: &str| {
        ferry()
            .args([
                "explain",
                "--lab",
                "--state-dir",
                &dir,
                "--conn",
                id,
                "-o",
                output,
            ])
            .output()
            .unwrap()
    };
    let v = json(&explain(&first, "json"));
    assert_eq!(v["record"]["id"], first.as_str(), "{v}");
    assert_eq!(v["record"]["direction"], "outbound");
    assert_eq!(
        v["hops"].as_array().unwrap().len(),
        hops.len() - 1,
        "the other hops of its trace: {v}"
    );
    assert_eq!(v["explained"]["from"], "alpha/default/sleep", "{v}");
    assert_eq!(
        v["explained"]["to"], "echo.default.svc.cluster.local:80",
        "{v}"
    );
    assert_eq!(v["explained"]["report"]["refused"], false, "{v}");
    // The report picks where the data path went: both landed on an echo pod.
    let landing = v["explained"]["report"]["hops"][0]["decision"]["outcome"]["Ok"]["landing"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(landing.contains("echo"), "{v}");
    // The last hop's record leads to the same flow.
    let w = json(&explain(&last, "json"));
    assert_eq!(w["explained"]["from"], v["explained"]["from"], "{w}");
    // Text: what the data path recorded, then the explanation.
    let o = explain(&first, "text");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    for part in [
        &format!("connection {first} as node/alpha-1 recorded it (outbound"),
        "  route    ",
        "  verdict  allowed",
        "  timings  decision ",
        "the other hops of its trace",
        "The same flow now (--from alpha/default/sleep --to echo.default.svc.cluster.local:80)",
    ] {
        assert!(t.contains(part), "no {part:?} in:\n{t}");
    }
    let o = explain("0-0", "text");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("no connection record with id \"0-0\" at the lab in"),
        "{}",
        text(&o)
    );
}
