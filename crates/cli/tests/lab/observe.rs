//! `ferry observe --follow` streams records as hops make them; `ferry trace --id` finds a
//! connection already made by the id of any of its records; both also read admin endpoints
//! given by address (`--admin`) instead of the lab's.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Lab, MESH, ferry};

/// How long a streamed record or a follower's readiness may take.
const BOUND: Duration = Duration::from_secs(15);

/// A `ferry observe --follow` running, its output read line by line; killed when dropped.
struct Follower {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
}

impl Follower {
    fn start(lab: &Lab, filters: &[&str]) -> Self {
        let mut child = ferry()
            .args(["observe", "--lab", "--follow", "--state-dir"])
            .arg(&lab.dir)
            .args(filters)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for the line on stderr that says every component answered; returns it.
    fn wait_following(&self) -> String {
        let deadline = Instant::now() + BOUND;
        let mut seen = Vec::new();
        loop {
            match self
                .stderr
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(l) if l.starts_with("ferry observe: following ") => return l,
                Ok(l) => seen.push(l),
                Err(e) => panic!("not following ({e:?}); stderr:\n{}", seen.join("\n")),
            }
        }
    }

    /// The next line it prints on stdout, within [`BOUND`].
    fn next_line(&self) -> Result<String, RecvTimeoutError> {
        self.stdout.recv_timeout(BOUND)
    }

    /// Its exit code, once it exited by itself within [`BOUND`].
    fn exit_code(&mut self) -> Option<i32> {
        let mut status = None;
        crate::harness::eventually(BOUND, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        status.and_then(|s| s.code())
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each line read from `r`, on a thread, as it comes.
fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// `ferry <args>` as JSON lines; it must succeed.
fn json_lines(args: &[&str]) -> Vec<Value> {
    let out = ferry().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// ledger-alpha (alpha-2) -> echo-alpha-1 on 9090 is denied by `default/deny-admin-port` at
/// alpha-1: a follower started before the connection prints the denial as it happens.
#[test]
fn observe_follow_streams_a_policy_denial_as_it_happens() {
    let Some(lab) = MESH.get() else { return };
    let mut follower = Follower::start(
        lab,
        &[
            "--verdict",
            "denied",
            "--from",
            "ledger-alpha",
            "--to",
            "198.18.1.20:9090",
            "--count",
            "1",
            "-o",
            "json",
        ],
    );
    let following = follower.wait_following();
    // Every node proxy and waypoint of the lab is followed.
    let (n, m) = following
        .trim_start_matches("ferry observe: following ")
        .trim_end_matches(" components")
        .split_once(" of ")
        .unwrap_or_else(|| panic!("{following}"));
    assert_eq!(n, m, "{following}");
    assert!(n.parse::<usize>().is_ok_and(|n| n >= 3), "{following}");

    let e = lab
        .send("ledger-alpha", "198.18.1.20:9090", "x")
        .expect_err("denied");
    assert!(e.contains("reset") || e.contains("refused"), "{e}");

    let line = follower
        .next_line()
        .unwrap_or_else(|e| panic!("no denial streamed within {BOUND:?}: {e:?}"));
    let r: Value = serde_json::from_str(&line).expect("a JSON record");
    assert_eq!(r["verdict"], "denied", "{r}");
    assert_eq!(r["policy"], "default/deny-admin-port", "{r}");
    assert_eq!(r["rule"], "0", "{r}");
    assert!(
        r["component"]
            .as_str()
            .is_some_and(|c| c.starts_with("node/")),
        "{r}"
    );
    // --count 1: it stops by itself once the record is printed.
    assert_eq!(follower.exit_code(), Some(0));
}

/// A traced connection echo-beta -> audit (beta's waypoint): `ferry trace --id` with the id of
/// its waypoint hop prints the same hops in the same order; `--cluster` keeps its records for
/// beta only; `--admin` reads the node proxy's admin endpoint by address.
#[test]
fn trace_by_id_prints_the_hops_of_a_connection_already_made() {
    let Some(lab) = MESH.get() else { return };
    let out = lab.trace("echo-beta", "198.18.10.5:80", "json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let traced: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let trace = traced["trace_id"].as_str().expect("a trace id").to_string();
    let hops = |v: &Value| -> Vec<(String, String)> {
        v["hops"]
            .as_array()
            .expect("hops")
            .iter()
            .map(|h| {
                let s = |k: &str| h[k].as_str().unwrap_or_default().to_string();
                (s("component"), s("id"))
            })
            .collect()
    };
    let made = hops(&traced);
    assert_eq!(made.len(), 3, "{traced}");
    let (_, waypoint_hop) = made
        .iter()
        .find(|(c, _)| c.starts_with("waypoint/"))
        .unwrap_or_else(|| panic!("no waypoint hop: {traced}"));

    let by_id = |extra: &[&str], output: &str| {
        ferry()
            .args(["trace", "--id", waypoint_hop, "-o", output, "--state-dir"])
            .arg(&lab.dir)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = by_id(&[], "json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(found["trace_id"], trace.as_str(), "{found}");
    assert_eq!(found["went_through"], true, "{found}");
    assert_eq!(hops(&found), made, "the same hops, in path order");

    let out = by_id(&[], "text");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("went through"), "{text}");
    assert!(text.contains(&format!("trace id    {trace}")), "{text}");
    assert_eq!(
        // One numbered line per hop (each hop's route and phases follow on lines of their own).
        text.lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .count(),
        3,
        "{text}"
    );

    // An id no component has.
    let out = ferry()
        .args(["trace", "--id", "0-0", "--state-dir"])
        .arg(&lab.dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no record with id 0-0"));

    // Every hop of it is in cluster beta.
    let dir = lab.dir.to_string_lossy().into_owned();
    let in_cluster = |c: &str| {
        json_lines(&[
            "observe",
            "--lab",
            "--state-dir",
            &dir,
            "--trace",
            &trace,
            "--cluster",
            c,
            "-o",
            "json",
        ])
    };
    assert_eq!(in_cluster("beta").len(), 3, "{:?}", in_cluster("beta"));
    assert!(in_cluster("alpha").is_empty());

    // The same from beta-1's admin endpoint by address, asked from its own namespace: its two
    // hops (the waypoint's are at the waypoint).
    let ns = lab.state(&["nodes", "beta-1", "netns"]);
    let admin = lab.state(&["nodes", "beta-1", "admin"]);
    let (ns, admin) = (ns.as_str().expect("netns"), admin.as_str().expect("admin"));
    let exe = env!("CARGO_BIN_EXE_ferry");
    let in_ns = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns, exe])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let observed = in_ns(&["observe", "--admin", admin, "--trace", &trace, "-o", "json"]);
    let components: Vec<Value> = observed
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON")["component"].clone())
        .collect();
    assert_eq!(
        components,
        [format!("admin/{admin}"), format!("admin/{admin}")],
        "{observed}"
    );
    let source_hop = &made[0].1;
    let traced = in_ns(&["trace", "--id", source_hop, "--admin", admin, "-o", "json"]);
    let traced: Value = serde_json::from_str(&traced).expect("JSON");
    assert_eq!(traced["trace_id"], trace.as_str(), "{traced}");
    assert_eq!(hops(&traced).len(), 2, "{traced}");
}
