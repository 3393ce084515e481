//! End to end in the lab: real namespaces, real capture, real HBONE. Needs root (CI runs as
//! root); elsewhere the test says why it did nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

/// Tears the lab down however the test ends.
struct Lab {
    dir: PathBuf,
    id: String,
}

impl Lab {
    fn up() -> Option<Self> {
        Self::up_with(None, "fT", "main")
    }

    fn up_with(topology: Option<&str>, id: &str, tag: &str) -> Option<Self> {
        Self::up_with_args(topology, id, tag, &[])
    }

    fn up_with_args(
        topology: Option<&str>,
        id: &str,
        tag: &str,
        node_args: &[&str],
    ) -> Option<Self> {
        if !nix_is_root() {
            eprintln!("skipping the lab test: it needs root to create network namespaces");
            return None;
        }
        let lab = Self {
            dir: std::env::temp_dir().join(format!("ferry-lab-test-{}-{tag}", std::process::id())),
            id: id.into(),
        };
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

    /// Runs `ferry lab <args>` against this lab and requires it to succeed.
    fn run(&self, args: &[&str]) {
        let out = ferry()
            .arg("lab")
            .args(args)
            .arg("--state-dir")
            .arg(&self.dir)
            .args(["--id", &self.id])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "lab {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn send(&self, pod: &str, to: &str, data: &str) -> Result<String, String> {
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

    fn log(&self, node: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{node}.log"))).unwrap_or_default()
    }

    /// Waits until `node`'s log has a line containing every one of `parts`; returns it.
    fn log_line(&self, node: &str, parts: &[&str]) -> String {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(l) = self
                .log(node)
                .lines()
                .find(|l| parts.iter().all(|p| l.contains(p)))
            {
                return l.to_string();
            }
            assert!(
                Instant::now() < end,
                "no line with {parts:?} in {node}.log:\n{}",
                self.log(node)
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn metrics(&self, node: &str, admin: &str) -> String {
        self.admin_get(node, admin, "/metrics")
    }

    /// One GET to an admin endpoint, from inside `node`'s (or a pod's) namespace.
    fn admin_get(&self, node: &str, admin: &str, path: &str) -> String {
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
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `ferry lab craft` in `exec_in`'s namespace: a credential for `identity` fetched
    /// with `node`'s token, then one CONNECT to `authority` through `to`. Returns its output.
    fn craft(&self, exec_in: &str, node: &str, flags: &[&str]) -> String {
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
    fn hold_until_policy(&self, pod: &str, to: &str, policy: &str) -> Option<String> {
        let topology = self.dir.join("topology.yaml");
        self.hold_until(pod, to, || {
            let mut text = std::fs::read_to_string(&topology).unwrap();
            text.push_str(policy);
            std::fs::write(&topology, text).unwrap();
        })
    }

    /// Holds one connection from `pod` to `to`, runs `act`, and returns what the holder printed
    /// next: `closed` (a FIN), `closed by reset (...)`, or nothing within 20 s.
    fn hold_until(&self, pod: &str, to: &str, act: impl FnOnce()) -> Option<String> {
        self.hold_until_with(pod, to, &[], act)
    }

    /// [`Lab::hold_until`], with more flags for `ferry lab hold` (e.g. `--upgrade`).
    fn hold_until_with(
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
    fn state(&self, path: &[&str]) -> serde_json::Value {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.dir.join("lab.json")).unwrap())
                .unwrap();
        for p in path {
            v = v[*p].take();
        }
        v
    }

    /// Open file descriptors of a node proxy process.
    fn node_fds(&self, node: &str) -> usize {
        let pid = self.state(&["nodes", node, "pid"]).as_u64().unwrap();
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
    }

    /// TCP sockets in CLOSE-WAIT or FIN-WAIT-2 inside a pod's network namespace.
    fn lingering_sockets(&self, pod: &str) -> Vec<String> {
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

    fn pids(&self) -> Vec<u32> {
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

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = ferry()
            .args(["lab", "down", "--state-dir"])
            .arg(&self.dir)
            .args(["--id", &self.id])
            .output();
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

#[test]
fn the_lab_carries_checks_and_refuses_traffic_end_to_end() {
    let Some(lab) = Lab::up() else { return };
    let payload: String = (0..2000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();

    // Same node: sleep (alpha-1) -> echo-alpha-1 (alpha-1), in HBONE, identity checked at B.
    let r = lab
        .send("sleep", "198.18.1.20:8080", &payload)
        .expect("same node");
    assert!(r.starts_with("echo-alpha-1 port 8080"), "{r}");
    assert!(r.ends_with(&payload), "bytes arrive intact");
    lab.log_line(
        "alpha-1",
        &[
            "direction=\"inbound\"",
            "src.identity=spiffe://cluster.local/ns/default/sa/sleep",
            "dst.addr=198.18.1.20:8080",
            "connection complete",
        ],
    );
    lab.log_line(
        "alpha-1",
        &[
            "direction=\"outbound\"",
            "dst.addr=198.18.1.20:8080",
            "dst.hbone_addr=198.18.1.20:15008",
            "path=hbone",
        ],
    );

    // Another node.
    let r = lab
        .send("sleep", "198.18.2.20:8080", &payload)
        .expect("other node");
    assert!(
        r.starts_with("echo-alpha-2 port 8080") && r.ends_with(&payload),
        "{r}"
    );
    lab.log_line(
        "alpha-2",
        &[
            "direction=\"inbound\"",
            "src.identity=spiffe://cluster.local/ns/default/sa/sleep",
            "dst.addr=198.18.2.20:8080",
            "connection complete",
        ],
    );

    // DENY for sleep -> echo on port 9090: refused at B, the log names the policy.
    let e = lab
        .send("sleep", "198.18.2.20:9090", "x")
        .expect_err("denied");
    assert!(e.contains("reset") || e.contains("refused"), "{e}");
    lab.log_line(
        "alpha-2",
        &[
            "direction=\"inbound\"",
            "dst.addr=198.18.2.20:9090",
            "denied by policy default/deny-admin-port",
        ],
    );

    // Out of the mesh: plain TCP, the destination sees the real source.
    let r = lab
        .send("sleep", "198.18.3.90:8080", "x")
        .expect("passthrough");
    assert!(r.starts_with("legacy port 8080 saw 198.18.1.10:"), "{r}");
    lab.log_line("alpha-1", &["dst.addr=198.18.3.90:8080", "path=plain tcp"]);

    // A local service whose only healthy waypoint endpoint is in beta: refused in alpha, and
    // nothing reaches beta.
    lab.send("sleep", "198.18.10.5:80", "x")
        .expect_err("no eligible waypoint endpoint");
    lab.log_line(
        "alpha-1",
        &[
            "dst.addr=198.18.10.5:80",
            "no waypoint endpoint is eligible for a source in cluster alpha",
        ],
    );
    let beta = lab.metrics("beta-1", "198.19.254.12:15000");
    assert!(
        beta.contains("istio_tcp_connections_opened_total"),
        "metrics answer: {beta}"
    );
    assert!(
        !beta.contains("audit-waypoint-beta"),
        "a connection reached beta's waypoint:\n{beta}"
    );
    assert!(
        !lab.log("beta-1").contains("198.18.10.5"),
        "beta saw the local service's traffic"
    );

    // From outside the mesh to a destination with a waypoint: through the waypoint process.
    let r = lab
        .send("legacy", "198.18.3.60:8080", "via the waypoint")
        .expect("through the waypoint");
    assert!(
        r.starts_with("audit-beta port 8080") && r.contains("via the waypoint"),
        "{r}"
    );
    lab.log_line(
        "beta-1",
        &[
            "dst.addr=198.18.3.60:8080",
            "path=plain tcp via waypoint default/audit-waypoint",
        ],
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "direction=\"waypoint\"",
            "dst.addr=198.18.3.60:8080",
            "connection complete",
        ],
    );

    // HTTP through the same waypoint is judged request by request: a read passes, a write
    // under /admin is refused with 403 by the waypoint and never reaches the pod.
    let get = "GET /admin/report HTTP/1.1\r\nHost: audit\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("legacy", "198.18.3.60:8081", get)
        .expect("an allowed request");
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("audit-beta http GET /admin/report"),
        "{r}"
    );
    let post = "POST /admin/report HTTP/1.1\r\nHost: audit\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("legacy", "198.18.3.60:8081", post)
        .expect("an answer from the waypoint");
    assert!(
        r.starts_with("HTTP/1.1 403") && !r.contains("audit-beta http"),
        "{r}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "waypoint denied the request",
            // Judged as what it is: unauthenticated, not as the pod its node relayed it for.
            "src.identity=(none: plain TCP relayed by spiffe://cluster.local/ns/default/sa/audit)",
            "http.method=POST",
            "http.path=/admin/report",
        ],
    );

    // A mesh source to audit's HTTP port: through the waypoint, three pipelined requests on one
    // connection, each judged on its own; the waypoint logs the original source, the pod's node
    // proxy sees the waypoint.
    let three = "GET /admin/a HTTP/1.1\r\nHost: audit\r\n\r\nPOST /admin/b HTTP/1.1\r\nHost: audit\r\nContent-Length: 0\r\n\r\nGET /ok HTTP/1.1\r\nHost: audit\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("echo-beta", "198.18.10.5:81", three)
        .expect("one connection, three answers");
    let statuses: Vec<&str> = r
        .lines()
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .map(|l| &l[9..12])
        .collect();
    assert_eq!(statuses, ["200", "403", "200"], "{r}");
    assert!(
        r.contains("audit-beta http GET /admin/a") && r.contains("audit-beta http GET /ok"),
        "{r}"
    );
    assert!(
        !r.contains("audit-beta http POST"),
        "the denied request reached the pod: {r}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "waypoint denied the request",
            "src.identity=spiffe://cluster.local/ns/default/sa/echo",
            "http.path=/admin/b",
            "http.status=403",
            "reason=denied by policy default/deny-audit-admin-writes rule 0",
        ],
    );
    lab.log_line(
        "beta-1",
        &[
            "direction=\"inbound\"",
            "src.identity=spiffe://cluster.local/ns/default/sa/audit-waypoint",
            "dst.addr=198.18.3.60:8081",
            // The original source rides in the tunnel's metadata, for the log.
            "path=hbone from waypoint spiffe://cluster.local/ns/default/sa/audit-waypoint for spiffe://cluster.local/ns/default/sa/echo",
            "connection complete",
        ],
    );
    // Bytes that are not HTTP on that port: judged once at L4, where the DENY holds on its
    // port alone; nothing reaches the pod.
    let r = lab.send("echo-beta", "198.18.10.5:81", "not http at all\n");
    assert!(
        r.as_ref().map_or(true, |r| !r.contains("audit-beta")),
        "{r:?}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "waypoint denied a connection that is not HTTP",
            "src.identity=spiffe://cluster.local/ns/default/sa/echo",
            "reason=denied by policy default/deny-audit-admin-writes rule 0",
        ],
    );
    // A header match: any request with `x-debug` is refused.
    let r = lab
        .send(
            "echo-beta",
            "198.18.10.5:81",
            "GET /ok HTTP/1.1\r\nX-Debug: 1\r\nConnection: close\r\n\r\n",
        )
        .expect("an answer from the waypoint");
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "waypoint denied the request",
            "http.path=/ok",
            "reason=denied by policy default/deny-audit-admin-writes rule 1",
        ],
    );

    // The waypoint's request metrics count the allowed and denied requests by response code,
    // labelled with the original source.
    let m = lab.metrics("audit-waypoint-beta", "198.18.3.50:15020");
    for code in ["200", "403"] {
        assert!(
            m.lines().any(|l| l.starts_with("istio_requests_total{")
                && l.contains(&format!("response_code=\"{code}\""))
                && l.contains("source_principal=\"spiffe://cluster.local/ns/default/sa/echo\"")),
            "no {code} line:\n{m}"
        );
    }
    assert!(
        m.contains("istio_request_duration_milliseconds_bucket{"),
        "{m}"
    );

    // HTTP routes at the waypoint: 400 requests on ONE connection from sleep (alpha) to shop,
    // each routed on its own, split 75/25 between the v1 and v2 subsets. Binomial standard
    // deviation 8.7 requests: v1 must get 260..=340 (about 4.6 deviations either side).
    let mut data = "GET /split HTTP/1.1\r\nHost: shop\r\n\r\n".repeat(399);
    data.push_str("GET /split HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n");
    let r = lab
        .send("sleep", "198.18.10.6:80", &data)
        .expect("400 answers on one connection");
    let v1 = r.matches("shop-v1 http GET /split").count();
    let v2 = r.matches("shop-v2 http GET /split").count();
    assert_eq!(v1 + v2, 400, "v1 {v1}, v2 {v2}:\n{r}");
    assert!((260..=340).contains(&v1), "v1 got {v1} of 400, v2 {v2}");
    // The canary route: a header sends every request to v2.
    let data = "GET /canary HTTP/1.1\r\nHost: shop\r\nX-Canary: yes\r\n\r\n".repeat(20)
        + "GET /canary HTTP/1.1\r\nHost: shop\r\nX-Canary: yes\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("sleep", "198.18.10.6:80", &data)
        .expect("21 answers on one connection");
    assert_eq!(r.matches("shop-v2 http GET /canary").count(), 21, "{r}");
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "http.route=split",
            "dst.workload=beta//v1/Pod/default/shop-v1",
            "src.identity=spiffe://cluster.local/ns/default/sa/sleep",
            "http.status=200",
        ],
    );

    // Straight to the pod, around the waypoint: nobody judges the HTTP, so the DENY applies on
    // its port alone and the node proxy refuses the connection (fail closed).
    lab.send("echo-beta", "198.18.3.60:8081", "GET / HTTP/1.1\r\n\r\n")
        .expect_err("refused around the waypoint");
    lab.log_line(
        "beta-1",
        &[
            "src.identity=spiffe://cluster.local/ns/default/sa/echo",
            "dst.addr=198.18.3.60:8081",
            "error=\"denied by policy default/deny-audit-admin-writes rule 0\"",
        ],
    );

    // A crafted tunnel straight to beta's waypoint claiming a source in beta, for catalog (local
    // to each cluster, only alpha has a pod): whatever the hop before decided, the waypoint
    // refuses and logs it. The same tunnel for a source in alpha is carried.
    let legacy_ns = {
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(lab.dir.join("lab.json")).unwrap())
                .unwrap();
        state["pods"]["legacy"]["netns"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let craft = |cluster: &str| {
        lab.craft(
            "alpha-1",
            "alpha-1",
            &[
                "--identity",
                "spiffe://cluster.local/ns/default/sa/sleep",
                "--to",
                "198.18.3.50:15008",
                "--peer-identity",
                "spiffe://cluster.local/ns/default/sa/audit-waypoint",
                "--authority",
                "198.18.10.3:80",
                "--dial-netns",
                &legacy_ns,
                "--cluster",
                cluster,
            ],
        )
    };
    let refused = craft("beta");
    assert!(
        refused.contains("refused") && refused.contains("503"),
        "{refused}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "waypoint refused the connection",
            "origin.cluster=beta",
            "dst.addr=198.18.10.3:80",
            "no endpoint is eligible for a source in cluster beta",
        ],
    );
    // Where the waypoint can check the claim, it does: a tunnel from sleep's own address with
    // sleep's identity that claims a source in beta is refused (401) and counted.
    let sleep_ns = lab.state(&["pods", "sleep", "netns"]);
    let forged = lab.craft(
        "alpha-1",
        "alpha-1",
        &[
            "--identity",
            "spiffe://cluster.local/ns/default/sa/sleep",
            "--to",
            "198.18.3.50:15008",
            "--peer-identity",
            "spiffe://cluster.local/ns/default/sa/audit-waypoint",
            "--authority",
            "198.18.10.6:80",
            "--dial-netns",
            sleep_ns.as_str().unwrap(),
            "--cluster",
            "beta",
        ],
    );
    assert!(
        forged.contains("refused") && forged.contains("401"),
        "{forged}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            "waypoint refused the connection",
            "the tunnel claims a source in cluster beta, but it comes from alpha//v1/Pod/default/sleep in cluster alpha",
        ],
    );
    // The same admin endpoints as a node proxy: its identity and its certificate (no keys).
    let dump = lab.admin_get("audit-waypoint-beta", "198.18.3.50:15020", "/config_dump");
    assert!(
        dump.contains("\"identity\":\"spiffe://cluster.local/ns/default/sa/audit-waypoint\"")
            && dump.contains("\"state\":\"ready\"")
            && !dump.contains("PRIVATE KEY"),
        "{dump}"
    );
    let certs = lab.admin_get("beta-1", "198.19.254.12:15000", "/certs");
    assert!(
        certs.contains("\"state\":\"ready\"") && !certs.contains("PRIVATE KEY"),
        "{certs}"
    );
    let m = lab.metrics("audit-waypoint-beta", "198.18.3.50:15020");
    let refused_total: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("ferry_waypoint_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused_total >= 1, "the refusal is not counted:\n{m}");
    let carried = craft("alpha");
    assert!(carried.contains("status 200"), "{carried}");

    // A multi-cluster service whose endpoint is alpha's own catalog VIP: one hop to the pod.
    let r = lab.send("sleep", "198.18.10.4:80", "x").expect("nested");
    assert!(r.starts_with("catalog-alpha port 8080"), "{r}");
    let line = lab.log_line(
        "alpha-1",
        &["direction=\"outbound\"", "dst.addr=198.18.10.4:80"],
    );
    assert!(
        line.contains("dst.hbone_addr=198.18.2.40:15008") && line.contains("path=hbone"),
        "one tunnel, to the pod: {line}"
    );
    lab.log_line(
        "alpha-2",
        &["direction=\"inbound\"", "dst.addr=198.18.2.40:8080"],
    );
    assert!(
        !lab.log("alpha-2")
            .lines()
            .any(|l| l.contains("direction=\"outbound\"") && l.contains("198.18.10.3")),
        "no second capture"
    );

    // Handovers of both nodes on the path while short connections keep coming: none refused.
    let stop = lab.dir.join("stop-churn");
    let churn = ferry()
        .args(["lab", "exec", "sleep", "--state-dir"])
        .arg(&lab.dir)
        .args(["--id", &lab.id, "--"])
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .args(["lab", "churn", "198.18.2.20:8080", "--until-file"])
        .arg(&stop)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for node in ["alpha-1", "alpha-2"] {
        lab.run(&["handover", node]);
    }
    std::fs::write(&stop, "").unwrap();
    let out = churn.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let counts: Vec<u64> = summary
        .split(' ')
        .filter_map(|kv| kv.split('=').nth(1)?.parse().ok())
        .collect();
    assert_eq!(counts.len(), 2, "{summary}");
    assert!(counts[0] > 0, "no connection made it: {summary}");
    assert_eq!(
        counts[1],
        0,
        "connections refused during the handovers: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = lab
        .send("sleep", "198.18.10.2:80", "after handover")
        .expect("served by the new node proxies");
    assert!(r.contains("after handover"), "{r}");

    // A node proxy restart: new connections work once it is back.
    lab.run(&["restart-node", "alpha-2"]);
    let r = lab
        .send("sleep", "198.18.10.2:80", "after restart")
        .expect("served after the restart");
    assert!(
        r.starts_with("ledger-alpha port 8080") && r.contains("after restart"),
        "{r}"
    );

    // A long-lived connection is closed when a policy change stops allowing it.
    assert!(
        lab.hold_until_policy("sleep", "198.18.2.20:8080", "  - name: deny-sleep-8080\n    namespace: default\n    selector: {app: echo}\n    action: deny\n    rules:\n      - from: [{principals: [cluster.local/ns/default/sa/sleep]}]\n        to: [{ports: [8080]}]\n").is_some_and(|l| l.starts_with("closed")),
        "the held connection was not closed by the policy change"
    );
    lab.log_line(
        "alpha-2",
        &["connection closed: no longer allowed by policy"],
    );
    assert!(
        lab.send("sleep", "198.18.2.20:8080", "x").is_err(),
        "new connections are denied too"
    );

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
            "policy change closed a tunnel",
            "reason=denied by policy default/deny-echo-audit rule 0",
        ],
    );
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
            "policy change closed a tunnel",
            "reason=denied by policy default/deny-echo-ws rule 0",
        ],
    );

    // Someone removes a pod's capture rules: the node proxy puts them back.
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lab.dir.join("lab.json")).unwrap()).unwrap();
    let sleep_ns = state["pods"]["sleep"]["netns"]
        .as_str()
        .unwrap()
        .to_string();
    let ipt = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &sleep_ns, "iptables", "-w", "-t", "nat"])
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(
        ipt(&["-D", "OUTPUT", "-p", "tcp", "-j", "FERRY_OUT"]),
        "rules were in place"
    );
    let end = Instant::now() + Duration::from_secs(15);
    while !ipt(&["-C", "OUTPUT", "-p", "tcp", "-j", "FERRY_OUT"]) {
        assert!(Instant::now() < end, "capture rules were not restored");
        std::thread::sleep(Duration::from_millis(50));
    }
    lab.log_line("alpha-1", &["capture rules were missing; restored"]);

    // The control plane goes away: the node keeps serving its last good configuration.
    let control = lab.pids()[0];
    let _ = Command::new("kill").arg(control.to_string()).status();
    let r = lab
        .send("sleep", "198.18.10.2:80", "after")
        .expect("still served without the control plane");
    assert!(r.contains("after"), "{r}");
}

#[test]
fn two_networks_meet_only_through_their_gateways() {
    let Some(lab) = Lab::up_with(Some("two-clusters.yaml"), "fU", "networks") else {
        return;
    };
    // A global service with pods only in west, from east: double HBONE through west's gateway.
    let r = lab
        .send("sleep-east", "198.18.10.5:80", "across")
        .expect("through the gateway");
    assert!(
        r.starts_with("search-west-1 port 7070") && r.contains("across"),
        "{r}"
    );
    // The destination's node proxy sees the original identity, not the gateway's.
    lab.log_line(
        "west-2",
        &[
            "direction=\"inbound\"",
            "src.identity=spiffe://cluster.local/ns/default/sa/sleep",
            "dst.addr=search.default.svc.cluster.local:80",
        ],
    );
    lab.log_line(
        "gateway-eastwest-west",
        &[
            "direction=\"gateway\"",
            "src.identity=spiffe://cluster.local/ns/default/sa/sleep",
            "dst.addr=search.default.svc.cluster.local:80",
            "connection complete",
        ],
    );
    // Metrics on the destination side label where the connection came from.
    let m = lab.metrics("west-2", "198.19.254.13:15000");
    assert!(
        m.lines()
            .any(|l| l.starts_with("istio_tcp_connections_opened_total")
                && l.contains("source_cluster=\"east\",source_network=\"net-east\"")
                && l.contains("destination_workload=\"search-west-1\"")
                && l.contains("destination_network=\"net-west\"")),
        "{m}"
    );

    // A crafted request straight to west's gateway for ledger, local to each cluster, from an
    // east identity: refused at the gateway (and counted in its log). The same request for the
    // global service passes.
    let craft = |authority: &str| {
        lab.craft(
            "eastwest-east",
            "east-1",
            &[
                "--identity",
                "spiffe://cluster.local/ns/default/sa/sleep",
                "--to",
                "198.19.255.1:15008",
                "--peer-identity",
                "spiffe://cluster.local/ns/istio-system/sa/eastwest-west",
                "--cluster",
                "east",
                "--authority",
                authority,
            ],
        )
    };
    let refused = craft("ledger.default.svc.cluster.local:80");
    assert!(
        refused.contains("refused") && refused.contains("401"),
        "{refused}"
    );
    lab.log_line(
        "gateway-eastwest-west",
        &[
            "gateway refused the connection",
            "dst.addr=ledger.default.svc.cluster.local:80",
        ],
    );
    let allowed = craft("search.default.svc.cluster.local:80");
    assert!(allowed.contains("status 200"), "{allowed}");

    // A west pod's address means nothing on east's network: no way around the gateway.
    assert!(
        lab.send("sleep-east", "198.19.2.70:7070", "x").is_err(),
        "networks are separate"
    );
    // Same-network traffic in each cluster still works as before.
    let r = lab
        .send("sleep-west", "198.19.10.2:80", "local")
        .expect("ledger in west");
    assert!(r.starts_with("ledger-west-1"), "{r}");
}

#[test]
fn pods_with_the_same_address_on_two_networks_are_never_confused() {
    let Some(lab) = Lab::up_with(Some("overlap.yaml"), "fV", "overlap") else {
        return;
    };
    // 198.18.1.20 is app-east on east's network and hello-west on west's.
    let r = lab
        .send("sleep-east", "198.18.1.20:8080", "x")
        .expect("east's own pod");
    assert!(r.starts_with("app-east port 8080"), "{r}");
    let r = lab
        .send("sleep-east", "198.18.10.1:80", "x")
        .expect("west's pod through the gateway");
    assert!(r.starts_with("hello-west port 8080"), "{r}");
    let r = lab
        .send("sleep-west", "198.18.1.20:8080", "x")
        .expect("west's own pod");
    assert!(r.starts_with("hello-west port 8080"), "{r}");
    lab.log_line(
        "gateway-gw-west",
        &[
            "direction=\"gateway\"",
            "dst.addr=hello.default.svc.cluster.local:80",
            "connection",
        ],
    );
}

/// Polls `f` until it holds, for at most `max`; returns whether it did.
fn eventually(max: Duration, mut f: impl FnMut() -> bool) -> bool {
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

#[test]
fn half_closed_and_abandoned_connections_do_not_outlive_the_idle_bound() {
    // Node proxies with a 2 s idle bound and a 1 s drain deadline; the destination app reads to
    // EOF and then never answers nor closes.
    let Some(lab) = Lab::up_with_args(
        None,
        "fS",
        "soak",
        &["--idle-bound-seconds=2", "--drain-seconds=1"],
    ) else {
        return;
    };
    const FLOWS: usize = 50;
    let (src, dst) = ("alpha-1", "alpha-2");
    let base = (lab.node_fds(src), lab.node_fds(dst));
    let start = |n: usize| {
        let mut c = ferry()
            .args(["lab", "exec", "sleep", "--state-dir"])
            .arg(&lab.dir)
            .args(["--id", &lab.id, "--"])
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args([
                "lab",
                "half-close",
                "198.18.2.20:7171",
                "--n",
                &n.to_string(),
            ])
            .args(["--max-seconds", "30"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(c.stdout.take().unwrap()));
        assert_eq!(lines.next().unwrap().unwrap(), format!("open {n}"));
        (c, lines)
    };

    // Live flows: descriptors grow by at most two per flow (plus a few pooled tunnels).
    let (mut client, mut lines) = start(FLOWS);
    assert!(
        eventually(Duration::from_secs(10), || lab.node_fds(dst)
            >= base.1 + FLOWS),
        "the destination node never held the flows"
    );
    let live = (lab.node_fds(src), lab.node_fds(dst));
    for (node, b, l) in [(src, base.0, live.0), (dst, base.1, live.1)] {
        assert!(
            l <= b + 2 * FLOWS + 8,
            "{node}: {l} descriptors with {FLOWS} flows, {b} idle"
        );
    }

    // Half-closed by the client, never finished by the server: every one is ended after the
    // bound, on both node proxies, with nothing left in CLOSE-WAIT or FIN-WAIT-2.
    std::io::Write::write_all(client.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let report = lines.next().unwrap().unwrap();
    assert!(
        report.starts_with(&format!("closed {FLOWS} of {FLOWS} in")),
        "{report}"
    );
    let _ = client.wait();
    for (node, b) in [(src, base.0), (dst, base.1)] {
        assert!(
            eventually(Duration::from_secs(10), || lab.node_fds(node) <= b + 4),
            "{node}: {} descriptors after the bound, {b} before the flows",
            lab.node_fds(node)
        );
    }
    for pod in ["sleep", "echo-alpha-2"] {
        let mut left = Vec::new();
        assert!(
            eventually(Duration::from_secs(10), || {
                left = lab.lingering_sockets(pod);
                left.is_empty()
            }),
            "{pod}: {left:?}"
        );
    }

    // Abandoned: the client process is killed with its connections open (the kernel closes
    // them); the server never finishes; both proxies let go within the bound.
    let (mut client, _lines) = start(FLOWS);
    assert!(eventually(Duration::from_secs(10), || {
        lab.node_fds(dst) >= base.1 + FLOWS
    }));
    let _ = client.kill();
    let _ = client.wait();
    for (node, b) in [(src, base.0), (dst, base.1)] {
        assert!(
            eventually(Duration::from_secs(15), || lab.node_fds(node) <= b + 4),
            "{node}: {} descriptors after abandoned flows, {b} before",
            lab.node_fds(node)
        );
    }

    // Vanished: the client's packets stop, both ways, without a FIN or a reset (dropped between
    // the app and its node proxy inside the pod). Keepalive ends the connections within the
    // bound on the source's proxy, and the tunnels with them on the destination's.
    let (mut client, _lines) = start(FLOWS);
    assert!(eventually(Duration::from_secs(10), || {
        lab.node_fds(dst) >= base.1 + FLOWS
    }));
    let sleep_ns = lab.state(&["pods", "sleep", "netns"]);
    let sleep_ns = sleep_ns.as_str().unwrap();
    let drop_rule = |op: &str, dir: &str| {
        Command::new("ip")
            .args([
                "netns", "exec", sleep_ns, "iptables", "-w", op, "OUTPUT", "-p", "tcp",
            ])
            .args([dir, "15001", "-j", "DROP"])
            .status()
            .unwrap()
            .success()
    };
    assert!(drop_rule("-I", "--dport") && drop_rule("-I", "--sport"));
    for (node, b) in [(src, base.0), (dst, base.1)] {
        assert!(
            eventually(Duration::from_secs(20), || lab.node_fds(node) <= b + 4),
            "{node}: {} descriptors after the peers vanished, {b} before",
            lab.node_fds(node)
        );
    }
    assert!(drop_rule("-D", "--dport") && drop_rule("-D", "--sport"));
    let _ = client.kill();
    let _ = client.wait();

    // kill -9 of the source's node proxy: while it is down, the pod's connections are refused
    // and nothing reaches the destination around the proxy (its node proxy, which captures the
    // destination pod's inbound traffic, sees nothing from the pod).
    lab.run(&["stop-node", src, "--kill"]);
    let mark = lab.log(dst).len();
    for to in ["198.18.2.20:8080", "198.18.10.1:80", "198.18.3.90:8080"] {
        lab.send("sleep", to, "while down")
            .expect_err("no connection while the node proxy is down");
    }
    assert!(
        !lab.log(dst)[mark..].contains("198.18.1.10"),
        "traffic from sleep reached {dst} while its node proxy was down:\n{}",
        &lab.log(dst)[mark..]
    );
    // Restarted, it serves the pod again from its own state, without re-enrollment; a pod in
    // that state it cannot serve is reported, and does not make it unready.
    let state_file = lab.dir.join(format!("{src}.pods"));
    let mut pods = std::fs::read_to_string(&state_file).unwrap();
    assert!(pods.contains("/Pod/default/sleep "), "{pods}");
    pods.push_str("alpha//v1/Pod/default/ghost /var/run/netns/ferry-test-no-such-netns\n");
    std::fs::write(&state_file, pods).unwrap();
    lab.run(&["start-node", src]);
    let r = lab
        .send("sleep", "198.18.2.20:8080", "back")
        .expect("served again");
    assert!(r.contains("back"), "{r}");
    let admin = lab.state(&["nodes", src, "admin"]);
    let admin = admin.as_str().unwrap();
    // (The restored pod waits a moment for its workload to appear in the mesh first.)
    let mut ready = String::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            ready = lab.admin_get(src, admin, "/ready");
            ready.starts_with("HTTP/1.1 200")
                && ready.contains("not served: alpha//v1/Pod/default/ghost")
        }),
        "{ready}"
    );
    assert!(
        lab.metrics(src, admin).contains("ferry_pods_unserved 1"),
        "the unserved pod is not counted"
    );

    // A pod's namespace deleted and created again under the same name: the node proxy notices
    // (checked every 2 s), and serves the new one, rules first.
    let ns = lab.state(&["pods", "ledger-alpha", "netns"]);
    let ns = ns.as_str().unwrap();
    for args in [["netns", "del", ns], ["netns", "add", ns]] {
        assert!(Command::new("ip").args(args).status().unwrap().success());
    }
    let rules = || {
        Command::new("ip")
            .args(["netns", "exec", ns, "iptables", "-w", "-t", "nat"])
            .args(["-C", "OUTPUT", "-p", "tcp", "-j", "FERRY_OUT"])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(
        eventually(Duration::from_secs(15), rules),
        "no capture rules in the re-created namespace"
    );
    lab.log_line(dst, &["namespace was created again: serving the new one"]);

    // Long-lived connections past a handover's drain deadline end with a FIN, never a reset:
    // the destination's node proxy handed over, then the source's.
    for node in [dst, src] {
        let ended = lab.hold_until("sleep", "198.18.2.20:8080", || {
            lab.run(&["handover", node]);
        });
        assert_eq!(
            ended.as_deref(),
            Some("closed"),
            "a connection held across the handover of {node}"
        );
        lab.log_line(
            node,
            &["drain deadline: ending the remaining connections with FIN"],
        );
    }
}
