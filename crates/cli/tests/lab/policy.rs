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

/// The lab's topology file as it was, written back when dropped (however the test ends).
struct Restore {
    path: std::path::PathBuf,
    text: String,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.text);
    }
}

/// echo-alpha-1 (alpha) -> echo-beta's address on 8080 (served by echo, global), then echo made
/// local: beta's node proxy, the last hop, ends the held tunnel (its origin is no longer in
/// scope). (Not from sleep: deny-sleep-8080 above may already deny it.)
#[test]
fn a_held_tunnel_is_closed_by_the_destination_when_a_scope_change_stops_admitting_its_origin() {
    let Some((lab, _one_at_a_time)) = POLICY.one_at_a_time() else {
        return;
    };
    let path = lab.dir.join("topology.yaml");
    let restore = Restore {
        text: std::fs::read_to_string(&path).unwrap(),
        path,
    };
    let global = "    scope: global\n    load_balancing: prefer_close\n";
    assert!(restore.text.contains(global), "echo is global");
    let closed = lab.hold_until("echo-alpha-1", "198.18.3.20:8080", || {
        let local = restore.text.replace(
            global,
            "    scope: local\n    load_balancing: prefer_close\n",
        );
        std::fs::write(&restore.path, local).unwrap();
    });
    assert!(
        closed.as_deref().is_some_and(|l| l.starts_with("closed")),
        "the held tunnel was not closed by the scope change: {closed:?}"
    );
    lab.log_line(
        "beta-1",
        &[
            Text("connection closed: no longer admitted by scope"),
            Text("does not admit a source in cluster alpha"),
        ],
    );
    lab.log_line(
        "beta-1",
        &[
            Field("direction", "inbound"),
            Field("dst.hbone_addr", "198.18.3.20:8080"),
            Field("response_flags", "DENY"),
            Text("does not admit a source in cluster alpha"),
        ],
    );
}
