//! Table tests for authorization.

use super::*;
use crate::model::{Cidr, PolicyScope, ServiceAccountMatch, StringMatch};
use crate::testing::{MeshBuilder, ip};

#[allow(clippy::needless_pass_by_value)] // reads better at call sites: mesh(vec![...])
fn mesh(policies: Vec<Policy>) -> (Snapshot, Workload) {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net").node("east-1", "east", "r/z/s");
    m.pod("echo", "east-1", "198.18.1.40");
    m.pod("other", "east-1", "198.18.1.41");
    for p in &policies {
        if p.scope == PolicyScope::WorkloadSelector {
            m.workload_mut("echo").authorization_policies.push(p.key());
        }
        m.policy(p.clone());
    }
    let snap = m.build();
    let echo = (**snap.workloads().find(|w| w.name == "echo").unwrap()).clone();
    (snap, echo)
}

fn policy(name: &str, scope: PolicyScope, action: Action, rules: Vec<Rule>) -> Policy {
    Policy {
        name: name.into(),
        namespace: "default".into(),
        scope,
        action,
        rules,
        dry_run: false,
    }
}

fn rule(matches: Vec<Match>) -> Rule {
    Rule {
        clauses: vec![Clause { matches }],
    }
}

fn from_principal(p: &str) -> Match {
    Match {
        principals: vec![StringMatch::from_pattern(p)],
        ..Match::default()
    }
}

fn port(p: u16) -> Match {
    Match {
        destination_ports: vec![p],
        ..Match::default()
    }
}

fn check(snap: &Snapshot, dst: &Workload, from: Option<&str>, port: u16) -> Verdict {
    let id: Option<Identity> = from.map(|f| {
        format!("spiffe://cluster.local/ns/default/sa/{f}")
            .parse()
            .unwrap()
    });
    authorize(
        snap,
        dst,
        &ConnInfo {
            source_identity: id.as_ref(),
            source_ip: ip("198.18.1.10"),
            destination_ip: ip("198.18.1.40"),
            destination_port: port,
            via_waypoint: false,
        },
    )
}

const SLEEP: &str = "cluster.local/ns/default/sa/sleep";

#[test]
fn no_policy_allows() {
    let (snap, echo) = mesh(vec![]);
    let v = check(&snap, &echo, Some("sleep"), 8080);
    assert_eq!(
        (v.effect, v.reason),
        (Effect::Allow, Reason::NoAllowPolicies)
    );
}

#[test]
fn allow_policy_that_applies_denies_by_default() {
    let (snap, echo) = mesh(vec![policy(
        "allow-sleep",
        PolicyScope::Namespace,
        Action::Allow,
        vec![rule(vec![from_principal(SLEEP)])],
    )]);
    assert!(check(&snap, &echo, Some("sleep"), 8080).is_allowed());
    let v = check(&snap, &echo, Some("intruder"), 8080);
    assert_eq!(
        (v.effect, v.reason),
        (Effect::Deny, Reason::NoAllowMatched { allow_policies: 1 })
    );
    let v = check(&snap, &echo, None, 8080);
    assert_eq!(
        v.effect,
        Effect::Deny,
        "plain text has no principal to match"
    );
}

#[test]
fn deny_wins_over_allow_and_names_its_rule() {
    let (snap, echo) = mesh(vec![
        policy(
            "allow-all",
            PolicyScope::Mesh,
            Action::Allow,
            vec![Rule::default()],
        ),
        policy(
            "deny-admin",
            PolicyScope::Namespace,
            Action::Deny,
            vec![rule(vec![port(9000)]), rule(vec![port(9090)])],
        ),
    ]);
    let v = check(&snap, &echo, Some("sleep"), 9090);
    assert_eq!(v.effect, Effect::Deny);
    assert_eq!(
        v.reason,
        Reason::DeniedBy(RuleRef {
            policy: PolicyKey::new("default", "deny-admin"),
            rule: 1
        })
    );
    let v = check(&snap, &echo, Some("sleep"), 8080);
    assert_eq!(
        v.reason,
        Reason::AllowedBy(RuleRef {
            policy: PolicyKey::new("default", "allow-all"),
            rule: 0
        })
    );
}

#[test]
fn audit_and_dry_run_never_change_the_verdict() {
    let mut dry = policy(
        "dry-deny",
        PolicyScope::Namespace,
        Action::Deny,
        vec![Rule::default()],
    );
    dry.dry_run = true;
    let (snap, echo) = mesh(vec![
        policy(
            "audit-all",
            PolicyScope::Namespace,
            Action::Audit,
            vec![Rule::default()],
        ),
        dry,
    ]);
    let v = check(&snap, &echo, Some("sleep"), 8080);
    assert_eq!(v.effect, Effect::Allow);
    assert_eq!(v.audited.len(), 1);
    assert_eq!(v.dry_run.len(), 1);
    assert_eq!(v.dry_run[0].0, Action::Deny);
}

#[test]
fn a_policy_without_rules_matches_nothing() {
    let (snap, echo) = mesh(vec![policy(
        "allow-nothing",
        PolicyScope::Namespace,
        Action::Allow,
        vec![],
    )]);
    assert_eq!(
        check(&snap, &echo, Some("sleep"), 8080).effect,
        Effect::Deny
    );
}

#[test]
fn selector_policies_apply_only_to_selected_workloads() {
    let (snap, echo) = mesh(vec![policy(
        "deny-echo",
        PolicyScope::WorkloadSelector,
        Action::Deny,
        vec![Rule::default()],
    )]);
    assert_eq!(
        check(&snap, &echo, Some("sleep"), 8080).effect,
        Effect::Deny
    );
    let other = (**snap.workloads().find(|w| w.name == "other").unwrap()).clone();
    assert_eq!(
        check(&snap, &other, Some("sleep"), 8080).effect,
        Effect::Allow
    );
}

#[test]
fn namespace_policies_stay_in_their_namespace() {
    let mut p = policy(
        "deny-all",
        PolicyScope::Namespace,
        Action::Deny,
        vec![Rule::default()],
    );
    p.namespace = "elsewhere".into();
    let (snap, echo) = mesh(vec![p]);
    assert_eq!(
        check(&snap, &echo, Some("sleep"), 8080).effect,
        Effect::Allow
    );
}

#[test]
fn match_fields_and_negations() {
    let cases: Vec<(&str, Match, Option<&str>, u16, bool)> = vec![
        (
            "principal prefix",
            from_principal("cluster.local/ns/default/*"),
            Some("sleep"),
            80,
            true,
        ),
        (
            "principal suffix",
            from_principal("*/sa/sleep"),
            Some("other"),
            80,
            false,
        ),
        (
            "presence needs an identity",
            from_principal("*"),
            None,
            80,
            false,
        ),
        (
            "not_principals holds for plain text",
            Match {
                not_principals: vec![StringMatch::Exact(SLEEP.into())],
                ..Match::default()
            },
            None,
            80,
            true,
        ),
        (
            "not_principals excludes",
            Match {
                not_principals: vec![StringMatch::Exact(SLEEP.into())],
                ..Match::default()
            },
            Some("sleep"),
            80,
            false,
        ),
        (
            "namespace from identity",
            Match {
                namespaces: vec![StringMatch::Exact("default".into())],
                ..Match::default()
            },
            Some("sleep"),
            80,
            true,
        ),
        (
            "not namespace",
            Match {
                not_namespaces: vec![StringMatch::Exact("default".into())],
                ..Match::default()
            },
            Some("sleep"),
            80,
            false,
        ),
        (
            "service account pair",
            Match {
                service_accounts: vec![ServiceAccountMatch {
                    namespace: "default".into(),
                    service_account: "sleep".into(),
                }],
                ..Match::default()
            },
            Some("sleep"),
            80,
            true,
        ),
        (
            "source ip block",
            Match {
                source_ips: vec!["198.18.1.0/24".parse::<Cidr>().unwrap()],
                ..Match::default()
            },
            None,
            80,
            true,
        ),
        (
            "not source ip",
            Match {
                not_source_ips: vec!["198.18.1.10".parse::<Cidr>().unwrap()],
                ..Match::default()
            },
            None,
            80,
            false,
        ),
        (
            "destination ip",
            Match {
                destination_ips: vec!["198.18.1.41".parse::<Cidr>().unwrap()],
                ..Match::default()
            },
            None,
            80,
            false,
        ),
        ("port", port(80), None, 80, true),
        ("other port", port(81), None, 80, false),
        (
            "not port",
            Match {
                not_destination_ports: vec![80],
                ..Match::default()
            },
            None,
            80,
            false,
        ),
        (
            "fields AND",
            Match {
                destination_ports: vec![80],
                ..from_principal(SLEEP)
            },
            Some("other"),
            80,
            false,
        ),
    ];
    for (name, m, from, p, expect_match) in cases {
        let (snap, echo) = mesh(vec![policy(
            "deny",
            PolicyScope::Namespace,
            Action::Deny,
            vec![rule(vec![m])],
        )]);
        let denied = check(&snap, &echo, from, p).effect == Effect::Deny;
        assert_eq!(denied, expect_match, "case {name:?}");
    }
}

#[test]
fn clauses_and_matches_combine_like_istio() {
    // (principal sleep OR principal other) AND (port 80)
    let r = Rule {
        clauses: vec![
            Clause {
                matches: vec![
                    from_principal(SLEEP),
                    from_principal("cluster.local/ns/default/sa/other"),
                ],
            },
            Clause {
                matches: vec![port(80)],
            },
        ],
    };
    let (snap, echo) = mesh(vec![policy(
        "allow",
        PolicyScope::Namespace,
        Action::Allow,
        vec![r],
    )]);
    assert!(check(&snap, &echo, Some("sleep"), 80).is_allowed());
    assert!(check(&snap, &echo, Some("other"), 80).is_allowed());
    assert!(!check(&snap, &echo, Some("sleep"), 81).is_allowed());
    assert!(!check(&snap, &echo, Some("third"), 80).is_allowed());
}

fn request(method: &'static str, path: &'static str) -> crate::authz::HttpRequest<'static> {
    crate::authz::HttpRequest {
        method,
        path,
        query: "",
        host: "echo.default.svc.cluster.local",
        headers: &[("x-team", "payments")],
    }
}

fn check_request(
    snap: &Snapshot,
    dst: &Workload,
    method: &'static str,
    path: &'static str,
) -> Verdict {
    let id: Identity = "spiffe://cluster.local/ns/default/sa/sleep"
        .parse()
        .unwrap();
    crate::authz::authorize_request(
        snap,
        dst,
        &ConnInfo {
            source_identity: Some(&id),
            source_ip: ip("198.18.1.10"),
            destination_ip: ip("198.18.1.40"),
            destination_port: 8080,
            via_waypoint: false,
        },
        &request(method, path),
    )
}

#[test]
fn l7_matches_need_an_http_request() {
    let get_only = Match {
        methods: vec![StringMatch::Exact("GET".into())],
        ..Match::default()
    };
    let (snap, echo) = mesh(vec![policy(
        "allow-get",
        PolicyScope::Namespace,
        Action::Allow,
        vec![rule(vec![get_only])],
    )]);
    assert!(check_request(&snap, &echo, "GET", "/").is_allowed());
    assert!(!check_request(&snap, &echo, "POST", "/").is_allowed());
    // At L4 there is no request: an L7-only ALLOW never matches, so the default deny holds.
    assert!(!check(&snap, &echo, Some("sleep"), 8080).is_allowed());
}

#[test]
fn l7_deny_on_paths_and_its_negation() {
    let admin = Match {
        paths: vec![StringMatch::from_pattern("/admin*")],
        ..Match::default()
    };
    let not_public = Match {
        not_paths: vec![StringMatch::from_pattern("/public*")],
        methods: vec![StringMatch::Exact("DELETE".into())],
        ..Match::default()
    };
    let (snap, echo) = mesh(vec![policy(
        "deny",
        PolicyScope::Namespace,
        Action::Deny,
        vec![rule(vec![admin]), rule(vec![not_public])],
    )]);
    assert!(!check_request(&snap, &echo, "GET", "/admin/users").is_allowed());
    assert!(check_request(&snap, &echo, "GET", "/public/x").is_allowed());
    assert!(!check_request(&snap, &echo, "DELETE", "/orders/1").is_allowed());
    assert!(check_request(&snap, &echo, "DELETE", "/public/1").is_allowed());
    // At L4 an L7 DENY holds on its other fields alone (here: none, so everything): traffic
    // that did not pass the waypoint is never let through on facts nobody checked.
    let verdict = check(&snap, &echo, Some("sleep"), 8080);
    assert!(!verdict.is_allowed());
    assert!(matches!(verdict.reason, Reason::DeniedBy(_)), "{verdict:?}");
    // From the destination's waypoint, which judged each request, it is not applied again.
    let via = authorize(
        &snap,
        &echo,
        &ConnInfo {
            source_identity: None,
            source_ip: ip("198.18.1.50"),
            destination_ip: ip("198.18.1.40"),
            destination_port: 8080,
            via_waypoint: true,
        },
    );
    assert!(via.is_allowed(), "{via:?}");
}

#[test]
fn l7_header_matches_need_the_header_with_a_matching_value() {
    use crate::model::HeaderMatch;
    let team = |v: &str| Match {
        headers: vec![HeaderMatch {
            name: "x-team".into(),
            values: vec![StringMatch::from_pattern(v)],
        }],
        ..Match::default()
    };
    // The request carries `x-team: payments`.
    let (snap, echo) = mesh(vec![policy(
        "allow-payments",
        PolicyScope::Namespace,
        Action::Allow,
        vec![rule(vec![team("pay*")])],
    )]);
    assert!(check_request(&snap, &echo, "GET", "/").is_allowed());
    let (snap, echo) = mesh(vec![policy(
        "allow-search",
        PolicyScope::Namespace,
        Action::Allow,
        vec![rule(vec![team("search")])],
    )]);
    assert!(!check_request(&snap, &echo, "GET", "/").is_allowed());
    let absent = Match {
        headers: vec![HeaderMatch {
            name: "x-debug".into(),
            values: vec![StringMatch::Presence],
        }],
        ..Match::default()
    };
    let (snap, echo) = mesh(vec![policy(
        "deny-debug",
        PolicyScope::Namespace,
        Action::Deny,
        vec![rule(vec![absent])],
    )]);
    assert!(
        check_request(&snap, &echo, "GET", "/").is_allowed(),
        "a header the request lacks does not match"
    );
}

#[test]
fn hosts_match_without_regard_to_case() {
    let host = Match {
        hosts: vec![StringMatch::from_pattern("ECHO.default.svc*")],
        ..Match::default()
    };
    let (snap, echo) = mesh(vec![policy(
        "deny-echo-host",
        PolicyScope::Namespace,
        Action::Deny,
        vec![rule(vec![host])],
    )]);
    // The request's host is `echo.default.svc.cluster.local`.
    assert!(!check_request(&snap, &echo, "GET", "/").is_allowed());
}
