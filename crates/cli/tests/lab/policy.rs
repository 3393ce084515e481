//! Held connections closed when a policy change stops allowing them: at L4, through a waypoint,
//! and upgraded. One at a time on their own lab ([`POLICY`]): each appends a policy to its
//! topology file, and the policies are disjoint (each denies a source-destination-port no other
//! scenario here uses), so the order they run in does not matter.

use crate::harness::Has::{Field, Text};
use crate::harness::Shared;

static POLICY: Shared = Shared::new(None, "fP", &[]);

/// sleep -> echo-alpha-2 on 8080, then a DENY for it.
#[test]
fn a_held_connection_is_closed_when_a_policy_change_stops_allowing_it() {
    let Some((lab, _one_at_a_time)) = POLICY.one_at_a_time() else {
        return;
    };
    // A long-lived connection is closed when a policy change stops allowing it.
    assert!(
        lab.hold_until_policy("sleep", "198.18.2.20:8080", "  - name: deny-sleep-8080\n    namespace: default\n    selector: {app: echo}\n    action: deny\n    rules:\n      - from: [{principals: [cluster.local/ns/default/sa/sleep]}]\n        to: [{ports: [8080]}]\n").is_some_and(|l| l.starts_with("closed")),
        "the held connection was not closed by the policy change"
    );
    lab.log_line(
        "alpha-2",
        &[Text("connection closed: no longer allowed by policy")],
    );
    assert!(
        lab.send("sleep", "198.18.2.20:8080", "x").is_err(),
        "new connections are denied too"
    );
}

/// legacy (outside the mesh) -> echo-beta on 8080 in plain TCP, then a DENY for its address.
#[test]
fn a_held_plain_connection_from_outside_the_mesh_is_closed_when_a_policy_change_stops_allowing_it()
{
    let Some((lab, _one_at_a_time)) = POLICY.one_at_a_time() else {
        return;
    };
    // The connection re-checks itself on the change, with its own facts (no identity, its
    // source address), and is reset on both sides.
    assert!(
        lab.hold_until_policy("legacy", "198.18.3.20:8080", "  - name: deny-legacy-echo-8080\n    namespace: default\n    selector: {app: echo}\n    action: deny\n    rules:\n      - from: [{ip_blocks: [198.18.3.90/32]}]\n        to: [{ports: [8080]}]\n").is_some_and(|l| l.starts_with("closed")),
        "the held plain connection was not closed by the policy change"
    );
    lab.log_line(
        "beta-1",
        &[
            Field("path", "plain tcp"),
            Text("connection closed: no longer allowed by policy"),
            Field("response_flags", "DENY"),
            Field("error.side", "local"),
        ],
    );
}

/// echo-beta -> audit on 8080 (carried at L4), then a DENY for echo.
#[test]
fn a_held_connection_through_the_waypoint_is_closed_when_a_policy_stops_its_source() {
    let Some((lab, _one_at_a_time)) = POLICY.one_at_a_time() else {
        return;
    };
    // The same through a waypoint: a held connection to audit (the app speaks first, so the
    // waypoint carries it at L4 after a silent second) is closed by the waypoint when a policy
    // stops allowing its original source. The pod's node sees only the waypoint.
    assert!(
        lab.hold_until_policy("echo-beta", "198.18.10.5:80", "  - name: deny-echo-audit\n    namespace: default\n    selector: {app: audit}\n    action: deny\n    rules:\n      - from: [{principals: [cluster.local/ns/default/sa/echo]}]\n        to: [{ports: [8080]}]\n").is_some_and(|l| l.starts_with("closed")),
        "the waypoint did not close the held tunnel on the policy change"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("policy change closed a tunnel"),
            Field("reason", "denied by policy default/deny-echo-audit rule 0"),
        ],
    );
}

/// echo-beta -> audit on 8081 with `Upgrade`, then a DENY on `/ws`.
#[test]
fn an_upgraded_connection_is_judged_again_and_closed_by_a_deny_on_its_path() {
    let Some((lab, _one_at_a_time)) = POLICY.one_at_a_time() else {
        return;
    };
    // An upgraded connection through the waypoint (HTTP port 81, `Upgrade` agreed to by the
    // app) is judged again, as its upgrade request, when the policy changes: a DENY on its path
    // closes it.
    let topology = lab.dir.join("topology.yaml");
    let upgraded = lab.hold_until_with("echo-beta", "198.18.10.5:81", &["--upgrade"], || {
        let mut text = std::fs::read_to_string(&topology).unwrap();
        text.push_str("  - name: deny-echo-ws\n    namespace: default\n    selector: {app: audit}\n    action: deny\n    rules:\n      - from: [{principals: [cluster.local/ns/default/sa/echo]}]\n        to: [{ports: [8081], paths: [\"/ws\"]}]\n");
        std::fs::write(&topology, text).unwrap();
    });
    assert!(
        upgraded.as_deref().is_some_and(|l| l.starts_with("closed")),
        "the upgraded connection was not closed by the policy change: {upgraded:?}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("policy change closed a tunnel"),
            Field("reason", "denied by policy default/deny-echo-ws rule 0"),
        ],
    );
}
