use super::*;
use crate::testing::MeshBuilder;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

#[test]
fn the_canonical_name_is_the_first_label_istio_reads_else_the_workload_name() {
    for (given, want) in [
        (&[][..], "reviews-v1-5d8c7"),
        (&[("app", "reviews")][..], "reviews"),
        (
            &[
                ("app", "reviews"),
                ("app.kubernetes.io/name", "reviews-k8s"),
            ][..],
            "reviews-k8s",
        ),
        (
            &[
                ("app", "reviews"),
                ("app.kubernetes.io/name", "reviews-k8s"),
                ("service.istio.io/canonical-name", "reviews-istio"),
            ][..],
            "reviews-istio",
        ),
        // Present counts, even empty (the label value is defaulted where it is exported).
        (&[("app", "")][..], ""),
        // Other labels are not read.
        (&[("name", "x"), ("version", "v1")][..], "reviews-v1-5d8c7"),
    ] {
        let l = labels(given);
        assert_eq!(canonical_name(&l, "reviews-v1-5d8c7"), want, "{given:?}");
    }
}

#[test]
fn the_canonical_revision_is_the_first_label_istio_reads_else_latest() {
    for (given, want) in [
        (&[][..], "latest"),
        (&[("version", "v1")][..], "v1"),
        (
            &[("version", "v1"), ("app.kubernetes.io/version", "1.2.0")][..],
            "1.2.0",
        ),
        (
            &[
                ("version", "v1"),
                ("app.kubernetes.io/version", "1.2.0"),
                ("service.istio.io/canonical-revision", "canary"),
            ][..],
            "canary",
        ),
        (&[("app", "reviews")][..], "latest"),
    ] {
        let l = labels(given);
        assert_eq!(canonical_revision(&l), want, "{given:?}");
    }
}

#[test]
fn a_workload_s_canonical_service_is_what_the_control_plane_sent_else_derived() {
    let mut m = MeshBuilder::new();
    m.cluster("c", "net").node("n", "c", "r/z/s");
    m.pod("reviews-1", "n", "198.18.1.1").labels = labels(&[("app", "reviews")]).into();
    let snap = m.build();
    let w = snap.workloads().next().unwrap();
    assert_eq!(
        canonical(w),
        Canonical {
            service: "reviews",
            revision: "latest"
        }
    );
    // istiod sends both (it does not send the labels).
    let sent = Workload {
        canonical_name: "ratings".into(),
        canonical_revision: "v2".into(),
        ..(**w).clone()
    };
    assert_eq!(
        canonical(&sent),
        Canonical {
            service: "ratings",
            revision: "v2"
        }
    );
}

/// echo backs `echo` (80 -> 8080) and `echo-admin` (90 -> 9090); `other` is a service echo does
/// not back.
fn services() -> Snapshot {
    let mut m = MeshBuilder::new();
    m.cluster("c", "net").node("n", "c", "r/z/s");
    m.pod("echo", "n", "198.18.1.1");
    m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
    m.service("echo-admin", &[("net", "198.18.100.2")], 90, 9090);
    m.service("other", &[("net", "198.18.100.3")], 80, 8080);
    m.backs("echo", "echo").backs("echo", "echo-admin");
    m.build()
}

#[test]
fn a_destination_counts_a_connection_under_the_named_service_it_backs_else_by_port() {
    let snap = services();
    let dst = snap.workloads().next().unwrap();
    let host = |n: &str| crate::testing::hostname(n);
    for (forwarded, port, want) in [
        // Named, and backed: that one, whatever the port.
        (Some(host("echo-admin")), 8080, Some("echo-admin")),
        (Some(host("echo")), 9090, Some("echo")),
        // Named, but not backed by the destination (a claim): by port instead.
        (Some(host("other")), 8080, Some("echo")),
        (Some("nonsense".to_string()), 9090, Some("echo-admin")),
        // Not named: by port.
        (None, 8080, Some("echo")),
        (None, 9090, Some("echo-admin")),
        (None, 7000, None),
    ] {
        let got = inbound_service(&snap, dst, forwarded.as_deref(), port);
        assert_eq!(
            got.map(|s| s.name.as_str()),
            want,
            "{forwarded:?} on {port}"
        );
    }
}
