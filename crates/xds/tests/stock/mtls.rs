//! PeerAuthentication over xDS: the Authorization resources and the workloads' policy keys
//! are what istiod sends ztunnel for the same PeerAuthentications, byte for byte, and a stock
//! peer enforces them as Ferry does.
//!
//! The expected resources are written by hand from istiod's code:
//! `pilot/pkg/serviceregistry/kube/controller/ambient/policies.go` (`DefaultPolicy`: the
//! static STRICT policy) and `.../ambient/authorization.go` (`convertPeerAuthentication`: the
//! converted one, and `convertedSelectorPeerAuthentications`: the keys a workload lists). Istio's
//! `Group` is `Rule` in these messages and its `Rules` is `Clause` (same field numbers).

use std::net::IpAddr;
use std::path::PathBuf;

use ferry_api::stock::security as sec;
use ferry_core::identity::Identity;
use ferry_xds::resources::ResourceSet;
use prost::Message;

use super::peer::{Conn, DryRun};
use super::{ferry_allows, stock};

fn presence() -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(sec::string_match::MatchType::Presence(())),
    }
}

/// `{not_principals: [presence]}`: no peer identity (plain TCP).
fn no_identity() -> sec::Clause {
    sec::Clause {
        matches: vec![sec::Match {
            not_principals: vec![presence()],
            ..Default::default()
        }],
    }
}

fn deny(namespace: &str, name: &str, rules: Vec<sec::Rule>) -> sec::Authorization {
    sec::Authorization {
        name: name.into(),
        namespace: namespace.into(),
        scope: sec::Scope::WorkloadSelector as i32,
        action: sec::Action::Deny as i32,
        rules,
        dry_run: false,
        extensions: vec![],
    }
}

/// istiod's `DefaultPolicy`, with the root namespace `istio-system`.
fn static_strict() -> sec::Authorization {
    deny(
        "istio-system",
        "istio_converted_static_strict",
        vec![sec::Rule {
            clauses: vec![no_identity()],
        }],
    )
}

fn example() -> ferry_topology::Topology {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/strict-mtls.yaml");
    ferry_topology::load_file(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The encoded resource named `name`, which must be `expected` exactly (bytes included: the
/// Ferry-only `ferry_policy` is left out of such a policy).
fn assert_sent(set: &ResourceSet, name: &str, expected: &sec::Authorization) {
    let body = &set
        .of_type(ferry_api::AUTHORIZATION_TYPE)
        .and_then(|t| t.get(name))
        .unwrap_or_else(|| panic!("no Authorization {name}"))
        .body;
    let got = sec::Authorization::decode(body.as_slice()).expect("decodes");
    assert_eq!(&got, expected, "{name}");
    assert_eq!(
        **body,
        expected.encode_to_vec(),
        "{name}: the bytes istiod sends"
    );
}

#[test]
fn the_example_sends_the_policies_istiod_sends() {
    let t = example();
    let set = ResourceSet::encode(&t.snapshot);
    // The namespace payments is STRICT: the static policy (sent because PeerAuthentications
    // exist) for vault.
    assert_sent(
        &set,
        "istio-system/istio_converted_static_strict",
        &static_strict(),
    );
    // ledger-metrics (mode unset, port 9090 PERMISSIVE) under the namespace's STRICT:
    // `convertPeerAuthentication` adds `not_destination_ports: [9090]` for the port, then
    // merges the inherited STRICT (`shouldMergeStrict`) as a second clause of the same rule.
    assert_sent(
        &set,
        "payments/converted_peer_authentication_ledger-metrics",
        &deny(
            "payments",
            "converted_peer_authentication_ledger-metrics",
            vec![sec::Rule {
                clauses: vec![
                    sec::Clause {
                        matches: vec![sec::Match {
                            not_destination_ports: vec![9090],
                            ..Default::default()
                        }],
                    },
                    no_identity(),
                ],
            }],
        ),
    );
    assert_eq!(
        set.of_type(ferry_api::AUTHORIZATION_TYPE).map(|t| t.len()),
        Some(2),
        "nothing else: the PERMISSIVE ones become no policy"
    );
    // The keys each workload lists (`convertedSelectorPeerAuthentications`).
    let peer = stock(&t.snapshot);
    let listed = |uid: &str| peer.workloads[uid].authorization_policies.clone();
    assert_eq!(
        listed("main//v1/Pod/payments/vault"),
        ["istio-system/istio_converted_static_strict"]
    );
    assert_eq!(
        listed("main//v1/Pod/payments/ledger"),
        ["payments/converted_peer_authentication_ledger-metrics"]
    );
    assert!(listed("main//v1/Pod/default/echo").is_empty());
    assert!(listed("main//v1/Pod/default/sleep").is_empty());
}

#[test]
fn a_stock_peer_refuses_plain_tcp_where_ferry_does() {
    let t = example();
    let snap = &t.snapshot;
    let peer = stock(snap);
    let sleep: Identity = "spiffe://cluster.local/ns/default/sa/sleep"
        .parse()
        .unwrap();
    let legacy: IpAddr = "198.18.1.90".parse().unwrap();
    // (destination, port, plain TCP accepted)
    for (name, port, plain) in [
        ("echo", 8080, true),
        ("vault", 8080, false),
        ("vault", 9090, false),
        ("ledger", 8080, false),
        ("ledger", 9090, true),
    ] {
        let dst = snap
            .workloads()
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("{name}"));
        for identity in [None, Some(&sleep)] {
            let c = Conn {
                src: if identity.is_some() {
                    "198.18.1.10".parse().unwrap()
                } else {
                    legacy
                },
                identity,
                dst: dst.addresses[0],
                port,
            };
            let expected = identity.is_some() || plain;
            assert_eq!(
                ferry_allows(snap, dst, &c),
                expected,
                "Ferry: {c:?} to {name}"
            );
            for mode in [DryRun::Honoured, DryRun::Ignored] {
                assert_eq!(
                    peer.allows(dst.uid.as_str(), &c, mode),
                    expected,
                    "stock peer: {c:?} to {name}"
                );
            }
        }
    }
}

#[test]
fn a_strict_workload_with_a_disabled_port_is_one_converted_policy() {
    // istiod's testdata `peer-authn-strict-and-disable-port-mtls.yaml`: STRICT with port 9090
    // DISABLE is `[not_principals presence] AND [not_destination_ports 9090]`, in one rule.
    let t = ferry_topology::parse(
        "t.yaml",
        "clusters: [{name: c, network: n}]\n\
         nodes: [{name: c-1, cluster: c}]\n\
         workloads: [{name: a, namespace: foo, node: c-1, address: 198.18.1.1, labels: {app: a}}]\n\
         peer_authentication:\n\
         - {name: strict-and-disable-mtls, namespace: foo, selector: {app: a}, mode: strict, port_level_mtls: {9090: disable}}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let set = ResourceSet::encode(&t.snapshot);
    assert_sent(
        &set,
        "foo/converted_peer_authentication_strict-and-disable-mtls",
        &deny(
            "foo",
            "converted_peer_authentication_strict-and-disable-mtls",
            vec![sec::Rule {
                clauses: vec![
                    no_identity(),
                    sec::Clause {
                        matches: vec![sec::Match {
                            not_destination_ports: vec![9090],
                            ..Default::default()
                        }],
                    },
                ],
            }],
        ),
    );
    // The static policy is sent as well (a PeerAuthentication exists), listed by no one.
    assert_sent(
        &set,
        "istio-system/istio_converted_static_strict",
        &static_strict(),
    );
    let peer = stock(&t.snapshot);
    assert_eq!(
        peer.workloads["c//v1/Pod/foo/a"].authorization_policies,
        ["foo/converted_peer_authentication_strict-and-disable-mtls"]
    );
}
