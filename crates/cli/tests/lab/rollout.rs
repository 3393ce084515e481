//! A rolling restart (`ferry lab rollout`) of a 3-replica service under steady new connections
//! refuses none. On its own lab (`rollout.yaml`, id fR): it restarts every app of the service.

use crate::harness::{Lab, ferry};

/// web-1, web-2, web-3 are restarted one at a time (terminating, stopped, started, ready) while
/// sleep opens 30 new connections a second to web's VIP for 6 s: none fails, and each replica
/// served connections after its restart.
#[test]
fn a_rolling_restart_of_three_replicas_fails_no_new_connection() {
    let Some(lab) = Lab::up_with(Some("rollout.yaml"), "fR") else {
        return;
    };
    let out = ferry()
        .args(["lab", "rollout", "web", "--rate", "30", "--seconds", "6"])
        .arg("--state-dir")
        .arg(&lab.dir)
        .args(["--id", &lab.id])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{report}");
    assert!(out.status.success(), "ferry lab rollout: {report}");
    assert!(stdout.lines().any(|l| l.ends_with(" failed=0")), "{report}");
    for pod in ["web-1", "web-2", "web-3"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("restarted {pod}:"))),
            "{pod} was not restarted: {report}"
        );
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("replica {pod}:")))
            .unwrap_or_else(|| panic!("no count for {pod}: {report}"));
        // "replica P: N connections, T while terminating, A after its restart"
        let numbers: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        let after = *numbers.last().unwrap();
        assert!(after > 0, "{pod} served nothing after its restart: {line}");
    }
}
