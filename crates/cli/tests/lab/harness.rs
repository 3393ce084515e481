//! The lab guard and what tests do with a lab: bring one up (or share one), send through it,
//! read its logs, metrics, admin endpoints and state.
//!
//! Labs are named by id (the prefix of their namespaces), so several coexist. Each lab keeps
//! its state in a directory named after its id, so a lab left behind by a killed run is removed
//! before the next one with that id comes up. Every Ferry process in a test lab logs JSON lines,
//! and log assertions match their fields ([`Has`]).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

/// `ferry`, logging JSON lines, as does every process it starts (they inherit the variable).
pub(crate) fn ferry() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.env("FERRY_LOG_FORMAT", "json");
    cmd
}

/// What a log line must have, checked against its JSON fields (`message` among them).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Has<'a> {
    /// This field, with exactly this value (a number as it is written).
    Field(&'a str, &'a str),
    /// This field, with a value that starts with this text.
    Starts(&'a str, &'a str),
    /// Text that the message or the value of some field contains.
    Text(&'a str),
}

/// One JSON line of a log: its event's fields.
#[derive(Debug)]
pub(crate) struct LogLine(serde_json::Value);

// === impl LogLine ===

impl LogLine {
    fn values(&self) -> impl Iterator<Item = (&str, String)> {
        self.0["fields"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    v.as_str().map_or_else(|| v.to_string(), str::to_string),
                )
            })
    }

    pub(crate) fn has(&self, part: &Has<'_>) -> bool {
        match *part {
            Has::Field(name, value) => self.values().any(|(k, v)| k == name && v == value),
            Has::Starts(name, text) => self.values().any(|(k, v)| k == name && v.starts_with(text)),
            Has::Text(text) => self.values().any(|(_, v)| v.contains(text)),
        }
    }
}

/// The lab that read-only scenarios share (the default topology): traffic through it only adds
/// log lines and counters that no other scenario on it looks for.
pub(crate) static MESH: Shared = Shared::new(None, "fT", &[]);

/// A default-topology lab for scenarios that change it and leave it as they found it (handovers,
/// a restart, capture repair), and for one that needs beta untouched since the lab came up. One
/// at a time; nothing here sends to beta. Outlier detection is off on it: the retry scenarios
/// count every connect to a pod that refuses, which an ejection would stop.
pub(crate) static CHANGING: Shared = Shared::new(None, "fL", CHANGING_ARGS);

pub(crate) const CHANGING_ARGS: &[&str] = &["--outlier-consecutive-failures=0"];

/// Node proxies with a 2 s idle bound and a 1 s drain deadline ([`SHORT_BOUNDS_ARGS`]), for the
/// idle-bound and drain-deadline scenarios, and a re-created namespace (which leaves ledger-alpha
/// without its app: nothing else here uses it). One at a time: they count descriptors.
pub(crate) static SHORT_BOUNDS: Shared = Shared::new(None, "fS", SHORT_BOUNDS_ARGS);

pub(crate) const SHORT_BOUNDS_ARGS: &[&str] = &["--idle-bound-seconds=2", "--drain-seconds=1"];

/// Tears the lab down however the test ends: on drop for a lab a test owns, and, for a
/// [`Shared`] one, by a watchdog process that waits for this process to exit.
#[derive(Debug)]
pub(crate) struct Lab {
    pub(crate) dir: PathBuf,
    pub(crate) id: String,
    /// For a shared lab: runs `ferry lab down` once this process has exited (however it did),
    /// seen as the end of its standard input, whose other end only this process holds.
    watchdog: Option<Child>,
}

// === impl Lab ===

impl Lab {
    pub(crate) fn up_with(topology: Option<&str>, id: &str) -> Option<Self> {
        Self::up_with_args(topology, id, &[])
    }

    pub(crate) fn up_with_args(
        topology: Option<&str>,
        id: &str,
        node_args: &[&str],
    ) -> Option<Self> {
        Self::up_with_all(topology, id, node_args, &[], &[])
    }

    /// A lab whose waypoints and gateways get `hop_args` (`ferry lab up --hop-arg`).
    pub(crate) fn up_with_hop_args(
        topology: Option<&str>,
        id: &str,
        hop_args: &[&str],
    ) -> Option<Self> {
        Self::up_with_all(topology, id, &[], hop_args, &[])
    }

    /// A lab brought up with `up_args`, further arguments of `ferry lab up` (such as
    /// `--kubernetes DIR`).
    pub(crate) fn up_with_up_args(
        topology: Option<&str>,
        id: &str,
        up_args: &[&str],
    ) -> Option<Self> {
        Self::up_with_all(topology, id, &[], &[], up_args)
    }

    fn up_with_all(
        topology: Option<&str>,
        id: &str,
        node_args: &[&str],
        hop_args: &[&str],
        up_args: &[&str],
    ) -> Option<Self> {
        claim_id(id);
        Self::up_claimed(topology, id, node_args, hop_args, up_args)
    }

    /// `up_with_all` for an id already claimed: a shared lab tries again with its own id after
    /// a failed `up` (the id is still its alone).
    fn up_claimed(
        topology: Option<&str>,
        id: &str,
        node_args: &[&str],
        hop_args: &[&str],
        up_args: &[&str],
    ) -> Option<Self> {
        if !nix_is_root() {
            eprintln!("skipping the lab test: it needs root to create network namespaces");
            return None;
        }
        let lab = Self {
            dir: std::env::temp_dir().join(format!("ferry-lab-test-{id}")),
            id: id.into(),
            watchdog: None,
        };
        // A lab left by a run that was killed (`down` is a no-op when there is none), once the
        // watchdog of a run that just ended, which holds the lab's lock, has removed its own.
        let _ = Command::new("flock")
            .arg(lab.lock())
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args(["lab", "down", "--state-dir"])
            .arg(&lab.dir)
            .args(["--id", &lab.id])
            .output();
        let mut cmd = ferry();
        cmd.args(["lab", "up"]);
        if let Some(t) = topology {
            cmd.arg(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../../examples")
                    .join(t),
            );
        }
        for a in node_args {
            cmd.arg(format!("--node-arg={a}"));
        }
        for a in hop_args {
            cmd.arg(format!("--hop-arg={a}"));
        }
        cmd.args(up_args);
        let out = cmd
            .arg("--state-dir")
            .arg(&lab.dir)
            .args(["--id", &lab.id])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "lab up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(lab)
    }

    /// A lock file for the lab's id: held by a shared lab's watchdog, awaited before `up`.
    fn lock(&self) -> PathBuf {
        self.dir.with_extension("lock")
    }

    fn down(&self) {
        let _ = ferry()
            .args(["lab", "down", "--state-dir"])
            .arg(&self.dir)
            .args(["--id", &self.id])
            .output();
    }

    /// Runs `ferry lab <args>` against this lab; how it ended.
    pub(crate) fn output(&self, args: &[&str]) -> std::process::Output {
        ferry()
            .arg("lab")
            .args(args)
            .arg("--state-dir")
            .arg(&self.dir)
            .args(["--id", &self.id])
            .output()
            .unwrap()
    }

    /// Runs `ferry lab <args>` against this lab and requires it to succeed.
    pub(crate) fn run(&self, args: &[&str]) {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "lab {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub(crate) fn send(&self, pod: &str, to: &str, data: &str) -> Result<String, String> {
        let out = ferry()
            .args(["lab", "send", pod, to, "--data", data, "--state-dir"])
            .arg(&self.dir)
            .args(["--id", &self.id])
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `n` new connections from `pod` to `to`, one after another, each of which must succeed,
    /// counted by the pod that answered (`by` names it from the answer).
    pub(crate) fn count_answers(
        &self,
        pod: &str,
        to: &str,
        n: usize,
        by: fn(&str) -> &'static str,
    ) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for i in 0..n {
            let a = self
                .send(pod, to, "count\n")
                .unwrap_or_else(|e| panic!("connection {i} from {pod} to {to} failed: {e}"));
            *counts.entry(by(&a)).or_insert(0) += 1;
        }
        counts
    }

    /// `ferry trace <pod> <to> -o <output>` on this lab; how it ended.
    pub(crate) fn trace(&self, pod: &str, to: &str, output: &str) -> std::process::Output {
        ferry()
            .args(["trace", pod, to, "--state-dir"])
            .arg(&self.dir)
            .args(["-o", output])
            .output()
            .unwrap()
    }

    /// A connection from `pod` to `to` traced (it must succeed): its trace id (32 hex digits,
    /// the same on every hop) and its hops as `component direction`, in path order.
    pub(crate) fn traced_hops(&self, pod: &str, to: &str) -> (String, Vec<String>) {
        let out = self.trace(pod, to, "json");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let id = v["trace_id"].as_str().unwrap_or_default().to_string();
        assert_eq!(id.len(), 32, "{v}");
        let hops = v["hops"]
            .as_array()
            .expect("hops")
            .iter()
            .map(|h| {
                assert_eq!(h["trace_id"], id.as_str(), "{h}");
                format!(
                    "{} {}",
                    h["component"].as_str().unwrap_or(""),
                    h["direction"].as_str().unwrap_or("")
                )
            })
            .collect();
        (id, hops)
    }

    pub(crate) fn log(&self, node: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{node}.log"))).unwrap_or_default()
    }

    /// The JSON lines of `node`'s log (every Ferry process in a test lab logs JSON), parsed;
    /// anything else in the log (a process's start-up banner) is skipped.
    pub(crate) fn log_lines(&self, node: &str) -> Vec<LogLine> {
        self.log(node)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .map(LogLine)
            .collect()
    }

    /// Waits until `node`'s log has a line that has every one of `parts`; returns it.
    pub(crate) fn log_line(&self, node: &str, parts: &[Has<'_>]) -> LogLine {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(l) = self
                .log_lines(node)
                .into_iter()
                .find(|l| parts.iter().all(|p| l.has(p)))
            {
                return l;
            }
            assert!(
                Instant::now() < end,
                "no line with {parts:?} in {node}.log:\n{}",
                self.log(node)
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub(crate) fn metrics(&self, node: &str, admin: &str) -> String {
        self.admin_get(node, admin, "/metrics")
    }

    /// One GET to an admin endpoint, from inside `node`'s (or a pod's) namespace.
    pub(crate) fn admin_get(&self, node: &str, admin: &str, path: &str) -> String {
        let out = ferry()
            .args(["lab", "exec", node, "--state-dir"])
            .arg(&self.dir)
            .args(["--id", &self.id, "--"])
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args([
                "lab",
                "connect",
                admin,
                "--data",
                // HTTP/1.1, so the answer's status line is `HTTP/1.1 ...` (an HTTP/1.0
                // request is answered in HTTP/1.0).
                &format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n"),
            ])
            .output()
            .unwrap();
        if out.status.success() {
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            // What went wrong stands in for the answer, so an assertion on it shows the cause.
            format!(
                "(no answer: ferry lab connect {}: {})",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        }
    }

    /// Runs `ferry lab craft` in `exec_in`'s namespace: a credential for `identity` fetched
    /// with `node`'s token, then one CONNECT to `authority` through `to`. Returns its output.
    pub(crate) fn craft(&self, exec_in: &str, node: &str, flags: &[&str]) -> String {
        let out = ferry()
            .args(["lab", "exec", exec_in, "--state-dir"])
            .arg(&self.dir)
            .args(["--id", &self.id, "--"])
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args(["lab", "craft", "--control", "https://198.19.254.1:15012"])
            .arg("--token-file")
            .arg(self.dir.join(format!("{node}.token")))
            .arg("--bundle-file")
            .arg(self.dir.join("bundle.pem"))
            .args(flags)
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Holds one connection from `pod` to `to`, appends `policy` to the lab's topology (which
    /// the control plane watches), and returns what the holder printed next (`closed...` when
    /// the connection was closed), waiting at most 20 s.
    pub(crate) fn hold_until_policy(&self, pod: &str, to: &str, policy: &str) -> Option<String> {
        let topology = self.dir.join("topology.yaml");
        self.hold_until(pod, to, || {
            let mut text = std::fs::read_to_string(&topology).unwrap();
            text.push_str(policy);
            std::fs::write(&topology, text).unwrap();
        })
    }

    /// Holds one connection from `pod` to `to`, runs `act`, and returns what the holder printed
    /// next: `closed` (a FIN), `closed by reset (...)`, or nothing within 20 s.
    pub(crate) fn hold_until(&self, pod: &str, to: &str, act: impl FnOnce()) -> Option<String> {
        self.hold_until_with(pod, to, &[], act)
    }

    /// [`Lab::hold_until`], with more flags for `ferry lab hold` (e.g. `--upgrade`).
    pub(crate) fn hold_until_with(
        &self,
        pod: &str,
        to: &str,
        flags: &[&str],
        act: impl FnOnce(),
    ) -> Option<String> {
        let mut hold = ferry()
            .args(["lab", "exec", pod, "--state-dir"])
            .arg(&self.dir)
            .args(["--id", &self.id, "--"])
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args(["lab", "hold", to, "--n", "1", "--until-closed"])
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(hold.stdout.take().unwrap()));
        assert_eq!(lines.next().unwrap().unwrap(), "held 1");
        act();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(lines.next().and_then(Result::ok));
        });
        let next = rx.recv_timeout(Duration::from_secs(20)).ok().flatten();
        let _ = hold.kill();
        let _ = hold.wait();
        next
    }

    /// A value from the lab's state file.
    pub(crate) fn state(&self, path: &[&str]) -> serde_json::Value {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.dir.join("lab.json")).unwrap())
                .unwrap();
        for p in path {
            v = v[*p].take();
        }
        v
    }

    /// Runs `iptables -w -t nat ARGS` in a pod's network namespace: its output if it succeeded.
    pub(crate) fn pod_nat(&self, pod: &str, args: &[&str]) -> Option<String> {
        let ns = self.state(&["pods", pod, "netns"]);
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns.as_str().unwrap(),
                "iptables",
                "-w",
                "-t",
                "nat",
            ])
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Whether a pod's chain `chain` holds `rule` (as `iptables -S` prints it, without `-A
    /// CHAIN`).
    pub(crate) fn pod_chain_has(&self, pod: &str, chain: &str, rule: &str) -> bool {
        self.pod_nat(pod, &["-S", chain])
            .is_some_and(|s| s.lines().any(|l| l == format!("-A {chain} {rule}")))
    }

    /// Open file descriptors of a node proxy process.
    pub(crate) fn node_fds(&self, node: &str) -> usize {
        let pid = self.state(&["nodes", node, "pid"]).as_u64().unwrap();
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
    }

    /// TCP sockets in CLOSE-WAIT or FIN-WAIT-2 inside a pod's network namespace.
    pub(crate) fn lingering_sockets(&self, pod: &str) -> Vec<String> {
        let ns = self.state(&["pods", pod, "netns"]);
        let out = Command::new("ip")
            .args(["netns", "exec", ns.as_str().unwrap(), "ss", "-tanH"])
            .args(["state", "close-wait", "state", "fin-wait-2"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Counts, from now on, the TCP packets to `port` that arrive in `pod`'s network namespace
    /// (an nft counter in a table of its own, removed when the probe is dropped): what reaches
    /// the pod's app, whoever sent it.
    pub(crate) fn probe(&self, pod: &str, port: u16) -> Probe {
        self.nft_table(
            pod,
            &format!("ferry_probe_{port}"),
            &format!(
                "type filter hook input priority -300; policy accept;\ntcp dport {port} counter"
            ),
        )
    }

    /// Resets, from now on, every TCP packet to `port` that arrives in `pod`'s network
    /// namespace (an nft rule, counted, in a table of its own, removed when the guard is
    /// dropped, however the test ends): a listener there that nothing can reach.
    pub(crate) fn refuse(&self, pod: &str, port: u16) -> Probe {
        self.nft_table(
            pod,
            &format!("ferry_refuse_{port}"),
            &format!("type filter hook input priority 0; policy accept;\ntcp dport {port} counter reject with tcp reset"),
        )
    }

    /// A fresh nft table of `pod`'s network namespace with one input chain of `chain`.
    fn nft_table(&self, pod: &str, table: &str, chain: &str) -> Probe {
        let netns = self
            .state(&["pods", pod, "netns"])
            .as_str()
            .unwrap()
            .to_string();
        let rules = format!(
            "table inet {table} {{}}\n\
             delete table inet {table}\n\
             table inet {table} {{\n\
             chain input {{\n\
             {chain}\n\
             }}\n\
             }}\n"
        );
        let probe = Probe {
            netns,
            table: table.to_string(),
        };
        probe.nft(&["-f", "-"], Some(&rules));
        assert_eq!(probe.packets(), 0, "a fresh counter");
        probe
    }

    /// The pid of the lab's `ferry <what>` process (`waypoint`, `gateway`) for `name` (a
    /// waypoint instance's or gateway's name), found by its command line.
    pub(crate) fn hop_pid(&self, what: &str, name: &str) -> u32 {
        self.pids()
            .into_iter()
            .find(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                args.get(1) == Some(&what.as_bytes())
                    && args.iter().any(|a| {
                        *a == name.as_bytes() || a.ends_with(format!("/{name}").as_bytes())
                    })
            })
            .unwrap_or_else(|| panic!("no ferry {what} process for {name}"))
    }

    /// Holds one connection from `pod` to `to` that pings every 200 ms (`ferry lab hold
    /// --ping-ms`); its lines (`ping <k>`, then `closed` or `closed by reset (...)`) arrive with
    /// the time they were read.
    pub(crate) fn hold_pinging(&self, pod: &str, to: &str) -> Held {
        let mut child = ferry()
            .args(["lab", "exec", pod, "--state-dir"])
            .arg(&self.dir)
            .args(["--id", &self.id, "--"])
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args([
                "lab",
                "hold",
                to,
                "--n",
                "1",
                "--until-closed",
                "--ping-ms",
                "200",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        assert_eq!(
            lines.next().unwrap().unwrap(),
            "held 1",
            "holding {to} from {pod}"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                if tx.send((Instant::now(), l)).is_err() {
                    return;
                }
            }
        });
        Held { child, lines: rx }
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.dir.join("lab.json")).unwrap())
                .unwrap();
        state["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as u32)
            .collect()
    }
}

/// A connection held by [`Lab::hold_pinging`]; the holder is killed when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    child: Child,
    pub(crate) lines: std::sync::mpsc::Receiver<(Instant, String)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.watchdog.is_none() {
            self.down();
        }
    }
}

/// A lab that several tests use, brought up by the first of them to ask. Statics are never
/// dropped, so its teardown is a watchdog process started with it: `sh` waits for the end of
/// its standard input, which comes when this test process exits (passed, failed or killed),
/// then runs `ferry lab down`. It runs in its own process group, so a Ctrl-C that stops the
/// tests does not stop it, and under `flock` on the lab's lock file, so a run started right
/// after this one waits for the teardown before bringing up a lab with the same id.
#[derive(Debug)]
pub(crate) struct Shared {
    topology: Option<&'static str>,
    id: &'static str,
    node_args: &'static [&'static str],
    lab: OnceLock<Option<Lab>>,
    claimed: std::sync::Once,
    serial: Mutex<()>,
}

// === impl Shared ===

impl Shared {
    pub(crate) const fn new(
        topology: Option<&'static str>,
        id: &'static str,
        node_args: &'static [&'static str],
    ) -> Self {
        Self {
            topology,
            id,
            node_args,
            lab: OnceLock::new(),
            claimed: std::sync::Once::new(),
            serial: Mutex::new(()),
        }
    }

    /// The lab, for a test that only sends through it and looks for what it caused; `None`
    /// when not root. (If bringing it up fails, the test fails, and the next one tries again.)
    pub(crate) fn get(&'static self) -> Option<&'static Lab> {
        self.lab
            .get_or_init(|| {
                // Claimed once: a retry after a failed `up` is the same lab, not a second one.
                self.claimed.call_once(|| claim_id(self.id));
                let mut lab = Lab::up_claimed(self.topology, self.id, self.node_args, &[], &[])?;
                let watchdog = Command::new("flock")
                    .arg(lab.lock())
                    .args([
                        "sh",
                        "-c",
                        r#"cat >/dev/null; exec "$0" lab down --state-dir "$1" --id "$2""#,
                    ])
                    .arg(env!("CARGO_BIN_EXE_ferry"))
                    .arg(&lab.dir)
                    .arg(&lab.id)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .process_group(0)
                    .spawn();
                match watchdog {
                    Ok(w) => lab.watchdog = Some(w),
                    Err(e) => panic!("cannot start the watchdog that removes the shared lab: {e}"),
                }
                Some(lab)
            })
            .as_ref()
    }

    /// The lab, held by this test alone until the guard is dropped: for tests that change it,
    /// or that look for what others would change.
    pub(crate) fn one_at_a_time(&'static self) -> Option<(&'static Lab, MutexGuard<'static, ()>)> {
        // (parking_lot's lock is not poisoned by a test that failed holding it.)
        let guard = self.serial.lock();
        Some((self.get()?, guard))
    }
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        && Path::new("/usr/sbin/ip").exists()
            | Path::new("/sbin/ip").exists()
            | Path::new("/usr/bin/ip").exists()
}

/// Takes `id` for one lab of this run. Two labs with one id share a state directory and
/// namespace names, and the second one's `up` tears down the first (as a lab left by a killed
/// run): a test whose lab vanished mid-way fails, far from the cause. So a second claim panics.
fn claim_id(id: &str) {
    static TAKEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    assert!(
        TAKEN.lock().insert(id.to_string()),
        "lab id {id} is used by two labs of this run: give one of them its own"
    );
}

/// Polls `f` until it holds, for at most `max`; returns whether it did.
pub(crate) fn eventually(max: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + max;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An nft packet counter in a pod's network namespace ([`Lab::probe`]).
#[derive(Debug)]
pub(crate) struct Probe {
    netns: String,
    table: String,
}

// === impl Probe ===

impl Probe {
    fn nft(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns, "nft"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Packets counted so far.
    pub(crate) fn packets(&self) -> u64 {
        let listed = self.nft(&["list", "table", "inet", &self.table], None);
        listed
            .split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counter in:\n{listed}"))
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "nft",
                "delete",
                "table",
                "inet",
            ])
            .arg(&self.table)
            .stderr(Stdio::null())
            .status();
    }
}
