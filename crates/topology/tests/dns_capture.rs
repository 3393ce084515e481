//! `dns_capture` on a workload: read per workload, off unless it says so.

use std::path::PathBuf;

use ferry_core::model::WorkloadUid;

#[test]
fn dns_capture_is_read_per_workload_and_off_by_default() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/dns.yaml");
    let topo = ferry_topology::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let capture = |uid: &str| {
        topo.snapshot
            .workload(&WorkloadUid::new(uid))
            .unwrap_or_else(|| panic!("{uid}"))
            .dns_capture
    };
    assert!(capture("alpha//v1/Pod/default/sleep"));
    assert!(capture("beta//v1/Pod/default/ledger-beta"));
    assert!(
        !capture("alpha//v1/Pod/default/plain"),
        "off unless asked for"
    );
    let bad = "clusters: [{name: a, network: n}]\nnodes: [{name: a-1, cluster: a}]\nworkloads: [{name: x, node: a-1, address: 198.18.1.1, dns_capture: yes-please}]\n";
    let e = ferry_topology::parse("bad.yaml", bad).expect_err("not a boolean");
    assert!(e.to_string().contains("dns_capture"), "{e}");
}
