//! Table tests of the PeerAuthentication conversion: the policies against the expected outputs
//! of istiod's own tests (`pilot/pkg/serviceregistry/kube/controller/ambient/testdata/
//! peer-authn-*.yaml`, each named below), the keys a workload lists, and what authorization
//! then decides for plain TCP and for a mesh peer.

use std::collections::BTreeMap;

use super::*;
use crate::authz::{self, ConnInfo, Reason};
use crate::identity::Identity;
use crate::model::MtlsMode::{Disable, Permissive, Strict, Unset};
use crate::model::Workload;
use crate::testing::{MeshBuilder, ip};

const ROOT: &str = "istio-system";

fn pa(
    namespace: &str,
    name: &str,
    selector: &[(&str, &str)],
    mode: MtlsMode,
    ports: &[(u16, MtlsMode)],
) -> PeerAuthentication {
    PeerAuthentication {
        name: name.into(),
        namespace: namespace.into(),
        selector: selector
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect(),
        mode,
        port_level: ports.iter().copied().collect(),
    }
}

fn mesh_wide(mode: MtlsMode) -> PeerAuthentication {
    pa(ROOT, "default", &[], mode, &[])
}

fn namespace_wide(mode: MtlsMode) -> PeerAuthentication {
    pa("foo", "default-foo", &[], mode, &[])
}

/// The workload-level one of istiod's test files: `app: a` in `foo`.
fn workload(name: &str, mode: MtlsMode, ports: &[(u16, MtlsMode)]) -> PeerAuthentication {
    pa("foo", name, &[("app", "a")], mode, ports)
}

fn no_identity() -> Match {
    Match {
        not_principals: vec![StringMatch::Presence],
        ..Match::default()
    }
}

fn not_port(p: u16) -> Match {
    Match {
        not_destination_ports: vec![p],
        ..Match::default()
    }
}

fn no_identity_on(p: u16) -> Match {
    Match {
        destination_ports: vec![p],
        ..no_identity()
    }
}

/// A rule (Istio's group) of one-match clauses (Istio's rules).
fn rule(clauses: Vec<Match>) -> Rule {
    Rule {
        clauses: clauses.into_iter().map(clause).collect(),
    }
}

fn converted(name: &str, rules: Vec<Rule>) -> Policy {
    Policy {
        name: format!("converted_peer_authentication_{name}"),
        namespace: "foo".into(),
        scope: PolicyScope::WorkloadSelector,
        action: Action::Deny,
        rules,
        dry_run: false,
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// The converted policies alone (the static STRICT one is always there).
fn converted_of(all: &[PeerAuthentication]) -> Vec<Policy> {
    let c = Conversion::new(ROOT, all);
    assert!(c.policies().contains(&static_strict(ROOT)));
    c.policies()
        .iter()
        .filter(|p| p.name != STATIC_STRICT)
        .cloned()
        .collect()
}

fn keys_of(all: &[PeerAuthentication], namespace: &str, l: &[(&str, &str)]) -> Vec<String> {
    Conversion::new(ROOT, all)
        .workload_policies(namespace, &labels(l))
        .iter()
        .map(ToString::to_string)
        .collect()
}

const STATIC: &str = "istio-system/istio_converted_static_strict";

#[test]
fn no_peer_authentication_sends_nothing() {
    let c = Conversion::new(ROOT, &[]);
    assert!(c.policies().is_empty());
    assert!(
        c.workload_policies("foo", &labels(&[("app", "a")]))
            .is_empty()
    );
}

#[test]
fn the_static_policy_denies_what_has_no_identity_in_the_root_namespace() {
    // istiod: `DefaultPolicy` in ambient/policies.go.
    let all = [mesh_wide(Permissive)];
    let c = Conversion::new(ROOT, &all);
    assert_eq!(
        c.policies(),
        [Policy {
            name: "istio_converted_static_strict".into(),
            namespace: "istio-system".into(),
            scope: PolicyScope::WorkloadSelector,
            action: Action::Deny,
            rules: vec![rule(vec![no_identity()])],
            dry_run: false,
        }]
    );
    // Sent, listed by no one: nothing is strict.
    assert!(keys_of(&[mesh_wide(Permissive)], "foo", &[]).is_empty());
}

#[test]
fn converted_policies_match_istiods_test_outputs() {
    let cases: Vec<(&str, Vec<PeerAuthentication>, Vec<Policy>)> = vec![
        (
            "peer-authn-strict-and-disable-port-mtls",
            vec![workload(
                "strict-and-disable-mtls",
                Strict,
                &[(9090, Disable)],
            )],
            vec![converted(
                "strict-and-disable-mtls",
                vec![rule(vec![no_identity(), not_port(9090)])],
            )],
        ),
        (
            "peer-authn-strict-and-permissive-port-mtls",
            vec![workload(
                "strict-and-permissive-mtls",
                Strict,
                &[(9090, Permissive)],
            )],
            vec![converted(
                "strict-and-permissive-mtls",
                vec![rule(vec![no_identity(), not_port(9090)])],
            )],
        ),
        (
            "peer-authn-unset-port-mtls-strict",
            vec![workload("strict-mtls", Unset, &[(8080, Strict)])],
            vec![converted(
                "strict-mtls",
                vec![rule(vec![no_identity_on(8080)])],
            )],
        ),
        (
            "peer-authn-disable-port-mtls-strict",
            vec![workload("disable-strict-mtls", Disable, &[(9090, Strict)])],
            vec![converted(
                "disable-strict-mtls",
                vec![rule(vec![no_identity_on(9090)])],
            )],
        ),
        (
            "peer-authn-permissive-port-mtls-strict-and-permissive",
            vec![workload(
                "permissive-strict-mtls",
                Permissive,
                &[(8080, Permissive), (9090, Strict)],
            )],
            vec![converted(
                "permissive-strict-mtls",
                vec![rule(vec![no_identity_on(9090)])],
            )],
        ),
        (
            // Ports in ascending order whatever the input's, one rule (group) each.
            "peer-authn-permissive-root-permissive-namespace-strict-workload-ports",
            vec![
                mesh_wide(Permissive),
                namespace_wide(Permissive),
                workload("workload", Unset, &[(9090, Strict), (8080, Strict)]),
            ],
            vec![converted(
                "workload",
                vec![
                    rule(vec![no_identity_on(8080)]),
                    rule(vec![no_identity_on(9090)]),
                ],
            )],
        ),
        (
            // The namespace's STRICT merged into the exception: ztunnel denies on any DENY, so
            // the static policy could not sit beside it.
            "peer-authn-permissive-root-strict-namespace-permissive-workload",
            vec![
                mesh_wide(Permissive),
                namespace_wide(Strict),
                workload("workload", Unset, &[(9090, Permissive)]),
            ],
            vec![converted(
                "workload",
                vec![rule(vec![not_port(9090), no_identity()])],
            )],
        ),
        (
            // (Its `-in.yaml` is not at hand: the input is read off the file's name.)
            "peer-authn-permissive-root-unset-namespace-mixed-workload-ports",
            vec![
                mesh_wide(Permissive),
                namespace_wide(Unset),
                workload("workload", Unset, &[(8080, Permissive), (9090, Strict)]),
            ],
            vec![converted(
                "workload",
                vec![rule(vec![no_identity_on(9090)])],
            )],
        ),
    ];
    for (file, input, expected) in cases {
        assert_eq!(converted_of(&input), expected, "{file}");
    }
}

#[test]
fn nothing_is_converted_that_the_static_policy_or_no_policy_covers() {
    for (what, input) in [
        (
            "all ports strict under STRICT",
            vec![workload("w", Strict, &[(8080, Strict)])],
        ),
        ("no port-level modes", vec![workload("w", Strict, &[])]),
        (
            "open ports under an open mode",
            vec![workload("w", Permissive, &[(8080, Disable)])],
        ),
        (
            "an open port under UNSET with nothing strict above",
            vec![workload("w", Unset, &[(8080, Permissive)])],
        ),
        (
            "port-level without a selector",
            vec![pa("foo", "ns", &[], Strict, &[(8080, Permissive)])],
        ),
        (
            "a selector in the root namespace",
            vec![pa(ROOT, "w", &[("app", "a")], Unset, &[(8080, Strict)])],
        ),
    ] {
        assert_eq!(converted_of(&input), [], "{what}");
    }
}

#[test]
fn a_workload_lists_what_its_effective_mode_asks_for() {
    let w = |mode, ports: &[(u16, MtlsMode)]| workload("w", mode, ports);
    let conv = "foo/converted_peer_authentication_w";
    let cases: Vec<(&str, Vec<PeerAuthentication>, Vec<&str>)> = vec![
        // Precedence: workload > namespace > mesh; UNSET inherits.
        ("mesh STRICT", vec![mesh_wide(Strict)], vec![STATIC]),
        (
            "namespace PERMISSIVE over mesh STRICT",
            vec![mesh_wide(Strict), namespace_wide(Permissive)],
            vec![],
        ),
        (
            "namespace UNSET inherits mesh STRICT",
            vec![mesh_wide(Strict), namespace_wide(Unset)],
            vec![STATIC],
        ),
        (
            "namespace STRICT over mesh PERMISSIVE",
            vec![mesh_wide(Permissive), namespace_wide(Strict)],
            vec![STATIC],
        ),
        (
            "workload DISABLE over namespace STRICT",
            vec![namespace_wide(Strict), w(Disable, &[])],
            vec![],
        ),
        (
            "workload STRICT over mesh PERMISSIVE",
            vec![mesh_wide(Permissive), w(Strict, &[])],
            vec![STATIC],
        ),
        (
            "workload UNSET inherits namespace STRICT",
            vec![namespace_wide(Strict), w(Unset, &[])],
            vec![STATIC],
        ),
        // Port-level: the converted policy replaces the static one, or comes alone.
        (
            "workload STRICT with a PERMISSIVE port",
            vec![w(Strict, &[(9090, Permissive)])],
            vec![conv],
        ),
        (
            "workload PERMISSIVE with a STRICT port",
            vec![w(Permissive, &[(9090, Strict)])],
            vec![conv],
        ),
        (
            "workload UNSET with a PERMISSIVE port under namespace STRICT",
            vec![namespace_wide(Strict), w(Unset, &[(9090, Permissive)])],
            vec![conv],
        ),
        (
            "workload UNSET with a STRICT port under nothing strict",
            vec![w(Unset, &[(9090, Strict)])],
            vec![conv],
        ),
        (
            "workload STRICT, every port STRICT",
            vec![w(Strict, &[(9090, Strict)])],
            vec![STATIC],
        ),
        // Istio's corner cases, reproduced (see the module's notes).
        (
            "workload UNSET with a DISABLE port under namespace STRICT: still all strict",
            vec![namespace_wide(Strict), w(Unset, &[(9090, Disable)])],
            vec![STATIC],
        ),
        (
            "workload PERMISSIVE with a STRICT port under mesh STRICT: nothing sent to list",
            vec![mesh_wide(Strict), w(Permissive, &[(9090, Strict)])],
            vec![],
        ),
        (
            "workload UNSET with a PERMISSIVE port, namespace UNSET, mesh STRICT",
            vec![
                mesh_wide(Strict),
                namespace_wide(Unset),
                w(Unset, &[(9090, Permissive)]),
            ],
            vec![],
        ),
    ];
    for (what, input, expected) in cases {
        assert_eq!(keys_of(&input, "foo", &[("app", "a")]), expected, "{what}");
    }
}

#[test]
fn the_oldest_of_a_level_wins_and_only_matching_selectors_count() {
    // Two namespace-wide ones: the first (oldest) decides.
    let first_strict = [
        namespace_wide(Strict),
        pa("foo", "later", &[], Permissive, &[]),
    ];
    assert_eq!(keys_of(&first_strict, "foo", &[]), [STATIC]);
    let first_open = [
        pa("foo", "earlier", &[], Permissive, &[]),
        namespace_wide(Strict),
    ];
    assert!(keys_of(&first_open, "foo", &[]).is_empty());
    // A selector the labels do not include, another namespace's, and the root namespace's
    // selectors change nothing.
    let others = [
        mesh_wide(Strict),
        pa("foo", "b", &[("app", "b")], Permissive, &[]),
        pa("bar", "a", &[("app", "a")], Permissive, &[]),
        pa(ROOT, "a", &[("app", "a")], Permissive, &[]),
    ];
    assert_eq!(keys_of(&others, "foo", &[("app", "a")]), [STATIC]);
    // Two workload-level ones selecting it: the first listed decides.
    let two = [
        pa("foo", "x", &[("app", "a")], Permissive, &[]),
        pa("foo", "y", &[("tier", "t")], Strict, &[]),
    ];
    assert!(keys_of(&two, "foo", &[("app", "a"), ("tier", "t")]).is_empty());
    // A workload in the root namespace takes the mesh's mode only.
    let root = [
        mesh_wide(Strict),
        pa(ROOT, "w", &[("app", "a")], Permissive, &[]),
    ];
    assert_eq!(keys_of(&root, ROOT, &[("app", "a")]), [STATIC]);
}

// === what authorization decides ===

/// A mesh with workload `a` (labels `app: a`) in `foo`, its PeerAuthentication policies
/// applied as the topology applies them.
fn enforce(all: &[PeerAuthentication]) -> (crate::snapshot::Snapshot, Workload) {
    let c = Conversion::new(ROOT, all);
    let mut m = MeshBuilder::new();
    m.cluster("east", "net").node("east-1", "east", "r/z/s");
    let w = m.pod("a", "east-1", "198.18.1.40");
    w.namespace = "foo".into();
    w.labels = labels(&[("app", "a")]).into();
    let keys = c.workload_policies("foo", &labels(&[("app", "a")]));
    m.workload_mut("a").authorization_policies = keys;
    for p in c.policies() {
        m.policy(p.clone());
    }
    let snap = m.build();
    let a = (**snap.workloads().find(|w| w.name == "a").unwrap()).clone();
    (snap, a)
}

fn verdict(
    snap: &crate::snapshot::Snapshot,
    dst: &Workload,
    peer: Option<&Identity>,
    port: u16,
) -> authz::Verdict {
    authz::authorize(
        snap,
        dst,
        &ConnInfo {
            source_identity: peer,
            source_ip: ip("198.18.9.9"),
            destination_ip: ip("198.18.1.40"),
            destination_port: port,
            via_waypoint: false,
        },
    )
}

#[test]
fn plain_tcp_is_denied_where_strict_and_a_mesh_peer_is_not() {
    let peer: Identity = "spiffe://cluster.local/ns/bar/sa/client".parse().unwrap();
    // (what, PeerAuthentications, ports plain TCP may reach, the policy that denies it)
    let cases: Vec<(&str, Vec<PeerAuthentication>, Vec<u16>, &str)> = vec![
        ("nothing", vec![], vec![8080, 9090], ""),
        (
            "mesh PERMISSIVE",
            vec![mesh_wide(Permissive)],
            vec![8080, 9090],
            "",
        ),
        ("mesh STRICT", vec![mesh_wide(Strict)], vec![], STATIC),
        (
            "mesh STRICT, namespace DISABLE",
            vec![mesh_wide(Strict), namespace_wide(Disable)],
            vec![8080, 9090],
            "",
        ),
        (
            "mesh PERMISSIVE, workload STRICT",
            vec![mesh_wide(Permissive), workload("w", Strict, &[])],
            vec![],
            STATIC,
        ),
        (
            "namespace STRICT, workload 9090 PERMISSIVE",
            vec![
                namespace_wide(Strict),
                workload("w", Unset, &[(9090, Permissive)]),
            ],
            vec![9090],
            "foo/converted_peer_authentication_w",
        ),
        (
            "workload STRICT, 9090 DISABLE",
            vec![workload("w", Strict, &[(9090, Disable)])],
            vec![9090],
            "foo/converted_peer_authentication_w",
        ),
        (
            "workload PERMISSIVE, 9090 STRICT",
            vec![workload("w", Permissive, &[(9090, Strict)])],
            vec![8080],
            "foo/converted_peer_authentication_w",
        ),
    ];
    for (what, input, open, denier) in cases {
        let (snap, a) = enforce(&input);
        for port in [8080, 9090] {
            let plain = verdict(&snap, &a, None, port);
            assert_eq!(
                plain.is_allowed(),
                open.contains(&port),
                "{what}: plain TCP to {port}"
            );
            if !plain.is_allowed() {
                let Reason::DeniedBy(r) = &plain.reason else {
                    panic!("{what}: {plain:?}")
                };
                assert_eq!(
                    (r.policy.to_string().as_str(), r.rule),
                    (denier, 0),
                    "{what}"
                );
            }
            assert!(
                verdict(&snap, &a, Some(&peer), port).is_allowed(),
                "{what}: a mesh peer to {port}"
            );
        }
    }
}
