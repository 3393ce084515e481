//! A waypoint and an east-west gateway drain on SIGTERM: the connections they carry go on until
//! the drain deadline and then end with a FIN, new ones are refused from the start of the
//! drain, and the process exits within the deadline and its grace.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::Has::{Field, Starts, Text};
use crate::harness::{Lab, eventually};

/// The deadline the lab's waypoints and gateways are given (`--drain-seconds`).
/// Long enough that the checks of the first seconds (new connections refused, the process
/// still running, each bounded by 4 s) all end before it, on a loaded machine too.
const DRAIN: Duration = Duration::from_secs(10);
/// How long past the deadline peers get to finish (the programs' `FINISH_GRACE`).
const GRACE: Duration = Duration::from_secs(6);

/// Its own lab (two-clusters.yaml): it stops a waypoint instance and a gateway.
#[test]
fn a_waypoint_and_a_gateway_drain_on_sigterm_within_their_deadline() {
    let Some(lab) = Lab::up_with_hop_args(Some("two-clusters.yaml"), "fD", &["--drain-seconds=10"])
    else {
        return;
    };
    // sleep-east -> echo goes through the east waypoint instance (to an east pod), and
    // sleep-east -> search through west's gateway (no waypoint): two independent paths.
    let cases = [
        ("waypoint", "shared-waypoint-east-1", "198.18.10.1:80"),
        ("gateway", "eastwest-west", "198.18.10.5:80"),
    ];
    let held: Vec<_> = cases
        .iter()
        .map(|&(what, name, to)| {
            let h = lab.hold_pinging("sleep-east", to);
            let (_, first) = h.lines.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(first, "ping 1", "{what} {name}: the held connection works");
            (what, name, to, lab.hop_pid(what, name), h)
        })
        .collect();
    let term = Instant::now();
    for (what, _, _, pid, _) in &held {
        let ok = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "SIGTERM to the {what}");
    }
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    // From the start of the drain, a new connection is refused (the process still runs).
    for (what, name, to, pid, _) in &held {
        assert!(
            eventually(Duration::from_secs(4), || lab
                .send("sleep-east", to, "new")
                .is_err()),
            "{what} {name} still takes new connections while draining"
        );
        assert!(
            alive(*pid),
            "{what} {name} exited {:?} after SIGTERM, before its deadline:\n{}",
            term.elapsed(),
            lab.log(&format!("{what}-{name}"))
        );
    }
    for (what, name, _, pid, h) in &held {
        // The held connection goes on working until the deadline, then ends with a FIN.
        let mut last_ping = term;
        let (at, end) = loop {
            let (at, line) = h
                .lines
                .recv_timeout(DRAIN + GRACE + Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{what} {name}: the held connection never ended"));
            if line.starts_with("ping ") {
                last_ping = at;
            } else {
                break (at, line);
            }
        };
        if *what == "waypoint" {
            assert_eq!(
                end, "closed",
                "{what} {name}: ended with a FIN, not a reset"
            );
        } else {
            // The gateway ends both sides with a FIN (its log says the tunnel completed), but
            // the bytes it carries are the inner TLS session, end to end between the node
            // proxies, which it cannot close: the source's node proxy sees that session end
            // without a close_notify and resets its client.
            // The gateway ended the tunnel at the deadline (its FIN then races the source's
            // reset, so the line may say either), and nothing was left after the grace.
            lab.log_line(
                "gateway-eastwest-west",
                &[
                    Field("direction", "gateway"),
                    Field("dst.addr", "search.default.svc.cluster.local:80"),
                    Starts("message", "connection "),
                ],
            );
            lab.log_line(
                "gateway-eastwest-west",
                &[
                    Field("program", "gateway"),
                    Text("drained"),
                    Field("left_after_grace", "0"),
                ],
            );
        }
        let (pinged, ended) = (last_ping - term, at - term);
        assert!(
            // Pings go every 200 ms; a stall of the loaded machine may hold one back a while.
            pinged >= DRAIN - Duration::from_millis(1500),
            "{what} {name}: the last echo came {pinged:?} after SIGTERM, before the {DRAIN:?} deadline"
        );
        assert!(
            ended >= DRAIN - Duration::from_millis(500) && ended <= DRAIN + GRACE,
            "{what} {name}: ended {ended:?} after SIGTERM, not at the {DRAIN:?} deadline"
        );
        // And the process is gone within the deadline and its grace.
        let left = (DRAIN + GRACE + Duration::from_millis(500)).saturating_sub(term.elapsed());
        assert!(
            eventually(left, || !alive(*pid)),
            "{what} {name} still runs {:?} after SIGTERM",
            term.elapsed()
        );
    }
}
