//! `ferry cni` run as a container runtime runs it: the harness plays the runtime, executing
//! the plugins of a real conflist in order (Debian's reference `bridge` with `host-local` IPAM,
//! then `ferry-cni`, a link to the ferry binary), with the CNI environment and the configuration
//! on stdin, each plugin's result passed to the next as `prevResult`. Behind the plugin run the
//! real node agent (`ferry cni agent`), node proxy (`ferry node --zds-socket`) and control
//! plane, all in a "host" network namespace the test creates (loopback and a bridge on
//! 198.18.61.0/24, no route out); pods are namespaces it creates too. Needs root and
//! containernetworking-plugins (`.ci/run` installs it); skipped when not root. Every namespace
//! and process is removed however the test ends.
//!
//! With `--node-name`, the agent reads enrollment from an API server: ferry-k8s's in-process
//! list/watch server (no Kubernetes runs here), reached over loopback with a kubeconfig, the
//! agent running in the test's own network namespace for that (it needs only files and Unix
//! sockets).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ferry_k8s::testing::ApiServer;
use ferry_runtime::netns::Netns;
use serde_json::{Value, json};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const PLUGINS: &str = "/usr/lib/cni";
const DEADLINE: Duration = Duration::from_secs(30);

/// The mesh of one world, whose pods are on 198.18.`net`.0/24.
fn topology(net: u8) -> String {
    format!(
        "\
trust_domain: cluster.local
clusters:
  - {{name: c1, network: n1}}
nodes:
  - {{name: node-1, cluster: c1, address: 198.18.{net}.1}}
workloads:
  - {{name: web, service_account: web, node: node-1, address: 198.18.{net}.10}}
"
    )
}

/// Polls `f` until it holds or `within` passes.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("running a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The host namespace, the pods' namespaces and the processes, removed on drop.
struct World {
    id: String,
    /// The pods' subnet is 198.18.`net`.0/24 (each test its own: the agent's search for pods
    /// that started before it sees every namespace of the machine).
    net: u8,
    dir: PathBuf,
    host: String,
    pods: Vec<String>,
    procs: Vec<(String, Child)>,
}

/// How one plugin invocation ended: its exit code and what it printed.
#[derive(Debug)]
struct Ran {
    ok: bool,
    stdout: Value,
}

/// Worlds made by this process (each test has its own namespaces and bridge).
static WORLDS: AtomicU32 = AtomicU32::new(0);

impl World {
    fn new() -> Self {
        Self::on(61)
    }

    /// A world whose pods are on 198.18.`net`.0/24.
    fn on(net: u8) -> Self {
        let n = WORLDS.fetch_add(1, Ordering::Relaxed);
        let id = format!("fc{}{n}", std::process::id());
        let dir = std::env::temp_dir().join(format!("ferry-cni-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::os::unix::fs::symlink(FERRY, dir.join("bin/ferry-cni")).unwrap();
        let host = format!("{id}h");
        let _ = Command::new("ip").args(["netns", "del", &host]).output();
        let w = Self {
            id,
            net,
            dir,
            host,
            pods: Vec::new(),
            procs: Vec::new(),
        };
        run(Command::new("ip").args(["netns", "add", &w.host]));
        run(Command::new("ip").args(["-n", &w.host, "link", "set", "lo", "up"]));
        w
    }

    /// A command run inside the host namespace.
    fn in_host(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host, program]);
        c
    }

    /// Starts `ferry <args>` in the host namespace, logging to `<name>.log`.
    fn start(&mut self, name: &str, args: &[&str]) {
        let cmd = self.in_host(FERRY);
        self.spawn(name, cmd, args);
    }

    /// Starts `ferry <args>` in the test's own network namespace (where its API server is).
    fn start_here(&mut self, name: &str, args: &[&str]) {
        self.spawn(name, Command::new(FERRY), args);
    }

    fn spawn(&mut self, name: &str, mut cmd: Command, args: &[&str]) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = cmd
            .args(args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.push((name.to_string(), child));
    }

    /// Starts the control plane on the topology; the node proxy's arguments.
    fn control_plane(&mut self) -> Vec<String> {
        std::fs::write(self.dir.join("topology.yaml"), topology(self.net)).unwrap();
        let control = self.path("control");
        let bundle = run(self
            .in_host(FERRY)
            .args(["control", "bundle", "--state-dir", &control]));
        std::fs::write(self.dir.join("bundle.pem"), &bundle.stdout).unwrap();
        let token = run(self.in_host(FERRY).args([
            "control",
            "token",
            "--state-dir",
            &control,
            "--node",
            "node-1",
        ]));
        std::fs::write(self.dir.join("node.token"), &token.stdout).unwrap();
        let topology = self.path("topology.yaml");
        self.start(
            "control",
            &[
                "control",
                "serve",
                "--topology",
                &topology,
                "--state-dir",
                &control,
                "--listen",
                "127.0.0.1:15012",
                "--metrics-listen",
                "127.0.0.1:15014",
            ],
        );
        self.wait_log("control", "serving the CA and xDS", 1);
        [
            "node",
            "--name",
            "node-1",
            "--cluster",
            "c1",
            "--admin",
            "127.0.0.1:15000",
            "--state-file",
            &self.path("node.pods"),
            "--zds-socket",
            &self.path("zds.sock"),
            "--control",
            "https://127.0.0.1:15012",
            "--token-file",
            &self.path("node.token"),
            "--bundle-file",
            &self.path("bundle.pem"),
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// The arguments of `ferry cni agent` enrolling namespace `default` by its flag.
    fn agent_args(&self) -> Vec<String> {
        [
            "cni",
            "agent",
            "--plugin-socket",
            &self.path("cni.sock"),
            "--zds-socket",
            &self.path("zds.sock"),
            "--namespace",
            "default",
            "--state-file",
            &self.path("agent-pods.json"),
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// An echo server outside the pods, in the host namespace on the bridge's address
    /// (198.18.`net`.1:7070), answering each connection's bytes as they come.
    fn echo_server(&self, rt: &tokio::runtime::Runtime) -> SocketAddr {
        let host = Netns::open(Path::new(&format!("/var/run/netns/{}", self.host))).unwrap();
        let server = SocketAddr::from(([198, 18, self.net, 1], 7070));
        let listener = rt.block_on(host.listen(server)).unwrap();
        rt.spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        server
    }

    /// A TCP connection from pod namespace `pod` to `to` (an app's socket: no mark, captured).
    fn connect_from(
        &self,
        rt: &tokio::runtime::Runtime,
        pod: &str,
        to: SocketAddr,
    ) -> std::net::TcpStream {
        let netns = Netns::open(Path::new(&format!("/var/run/netns/{pod}"))).unwrap();
        let conn = rt
            .block_on(netns.run(move || std::net::TcpStream::connect_timeout(&to, DEADLINE)))
            .unwrap()
            .unwrap();
        conn.set_read_timeout(Some(DEADLINE)).unwrap();
        conn
    }

    /// The pids listening on the node proxy's outbound port in pod namespace `netns`.
    fn listeners(&self, netns: &str) -> Vec<u32> {
        let out = run(Command::new("ip").args(["netns", "exec", netns, "ss", "-ltnpH"]));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(":15001 "))
            .flat_map(|l| l.split("pid=").skip(1))
            .filter_map(|p| p.split(',').next()?.parse().ok())
            .collect()
    }

    fn pid(&self, name: &str) -> u32 {
        self.procs.iter().find(|(n, _)| n == name).unwrap().1.id()
    }

    /// Whether process `name` has exited.
    fn exited(&mut self, name: &str) -> bool {
        self.procs
            .iter_mut()
            .find(|(n, _)| n == name)
            .is_some_and(|(_, c)| c.try_wait().ok().flatten().is_some())
    }

    /// Starts `ferry cni agent --node-name node-1` reading enrollment from `api` (through a
    /// kubeconfig), in the test's own network namespace where `api` listens.
    fn start_kube_agent(&mut self, api: &ApiServer) {
        let kubeconfig = self.path("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: t, cluster: {{server: 'http://{}'}}}}]\n\
                 users: [{{name: t, user: {{}}}}]\ncontexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n\
                 current-context: t\n",
                api.addr
            ),
        )
        .unwrap();
        let args = [
            "cni",
            "agent",
            "--node-name",
            "node-1",
            "--kubeconfig",
            &kubeconfig,
            "--plugin-socket",
            &self.path("cni.sock"),
            "--zds-socket",
            &self.path("zds.sock"),
            "--state-file",
            &self.path("agent-pods.json"),
        ]
        .map(str::to_string);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.start_here("agent", &args);
    }

    fn stop(&mut self, name: &str) {
        if let Some(i) = self.procs.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.procs.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Waits until `name`'s log has had `needle` `times` times.
    fn wait_log(&self, name: &str, needle: &str, times: usize) {
        assert!(
            eventually(DEADLINE, || self.log(name).matches(needle).count() >= times),
            "{name} never logged {needle:?} ({times}x):\n{}",
            self.log(name)
        );
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// A pod's network namespace (as a runtime creates one before running the plugins).
    fn pod(&mut self, name: &str) -> String {
        let ns = format!("{}{name}", self.id);
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        run(Command::new("ip").args(["netns", "add", &ns]));
        self.pods.push(ns.clone());
        // Its loopback up, as the runtime sets it up apart from the conflist.
        run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]));
        ns
    }

    /// The conflist: a bridge with host-local addresses, then Ferry.
    fn conflist(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "ferry-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": format!("{}br", self.id),
                    "isGateway": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{
                            "subnet": format!("198.18.{}.0/24", self.net),
                            "rangeStart": format!("198.18.{}.10", self.net),
                            "rangeEnd": format!("198.18.{}.20", self.net),
                        }]],
                        "dataDir": self.path("ipam"),
                    }
                },
                {"type": "ferry-cni", "agent_socket": self.path("cni.sock")}
            ]
        })
    }

    /// Runs one plugin of the list as the runtime does.
    fn plugin(
        &self,
        command: &str,
        plugin: &Value,
        prev: Option<&Value>,
        netns: &str,
        k8s: (&str, &str),
    ) -> Ran {
        let list = self.conflist();
        let mut conf = plugin.clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        conf["name"] = list["name"].clone();
        if let Some(p) = prev {
            conf["prevResult"] = p.clone();
        }
        let kind = plugin["type"].as_str().unwrap();
        let path = format!("{PLUGINS}:{}", self.path("bin"));
        let exe = if kind == "ferry-cni" {
            self.path("bin/ferry-cni")
        } else {
            format!("{PLUGINS}/{kind}")
        };
        let mut child = self
            .in_host(&exe)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", format!("ctr-{}", k8s.1))
            .env("CNI_NETNS", format!("/var/run/netns/{netns}"))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", path)
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={}",
                    k8s.0, k8s.1
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), conf.to_string().as_bytes())
            .unwrap();
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        let stdout = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        Ran {
            ok: out.status.success(),
            stdout,
        }
    }

    /// ADD through the whole list: the last plugin's result, and each plugin's.
    fn add(&self, netns: &str, k8s: (&str, &str)) -> (Ran, Vec<Value>) {
        let mut prev: Option<Value> = None;
        let mut each = Vec::new();
        let list = self.conflist();
        let plugins = list["plugins"].as_array().unwrap();
        for (i, p) in plugins.iter().enumerate() {
            let ran = self.plugin("ADD", p, prev.as_ref(), netns, k8s);
            if !ran.ok || i + 1 == plugins.len() {
                return (ran, each);
            }
            each.push(ran.stdout.clone());
            prev = Some(ran.stdout);
        }
        unreachable!("a list of plugins")
    }

    /// CHECK or DEL through the list (DEL in reverse), with the ADD's result: whether every
    /// plugin succeeded, and the first failure's output.
    fn check_or_del(&self, command: &str, netns: &str, k8s: (&str, &str), result: &Value) -> Ran {
        let list = self.conflist();
        let mut plugins: Vec<Value> = list["plugins"].as_array().unwrap().clone();
        if command == "DEL" {
            plugins.reverse();
        }
        for p in &plugins {
            let ran = self.plugin(command, p, Some(result), netns, k8s);
            if !ran.ok {
                return ran;
            }
        }
        Ran {
            ok: true,
            stdout: Value::Null,
        }
    }

    /// The pod's nat table.
    fn nat(&self, netns: &str) -> String {
        let out =
            run(Command::new("ip").args(["netns", "exec", netns, "iptables-save", "-t", "nat"]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether something listens on the node proxy's outbound port in the pod.
    fn served(&self, netns: &str) -> bool {
        let out = run(Command::new("ip").args(["netns", "exec", netns, "ss", "-ltnH"]));
        String::from_utf8_lossy(&out.stdout).contains(":15001")
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.pods.iter().chain([&self.host]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[test]
fn pods_chained_through_ferry_cni_are_served_checked_and_released_and_others_left_alone() {
    if !nix_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    assert!(
        Path::new(PLUGINS).join("bridge").exists(),
        "the reference CNI plugins are missing: apt-get install containernetworking-plugins"
    );
    let mut w = World::new();
    // The control plane, the agent (namespace `default` enrolled) and the node proxy.
    let node_args = w.control_plane();
    let agent_args = w.agent_args();
    let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
    w.start("agent", &agent_args);
    w.wait_log("agent", "node agent serving", 1);
    w.start("node", &node_args);
    w.wait_log("agent", "replay acknowledged", 1);

    // A pod of an enrolled namespace: its address from host-local, the result passed on, and
    // served by the node proxy (capture rules and its listeners in the pod) before ADD returns.
    let web = w.pod("web");
    let (ran, each) = w.add(&web, ("default", "web"));
    assert!(ran.ok, "ADD: {}\nagent:\n{}", ran.stdout, w.log("agent"));
    assert_eq!(
        ran.stdout["ips"][0]["address"], "198.18.61.10/24",
        "{}",
        ran.stdout
    );
    assert_eq!(
        ran.stdout, each[0],
        "ferry-cni passes the bridge's result on unchanged"
    );
    assert!(
        w.nat(&web).contains("-A OUTPUT -p tcp -j FERRY_OUT"),
        "{}",
        w.nat(&web)
    );
    assert!(w.served(&web), "the node proxy listens in the pod");
    let web_result = ran.stdout;
    assert!(
        w.check_or_del("CHECK", &web, ("default", "web"), &web_result)
            .ok
    );

    // A pod of a namespace not enrolled: set up by the bridge, left alone by Ferry.
    let plain = w.pod("plain");
    let (ran, _) = w.add(&plain, ("plain", "other"));
    assert!(ran.ok, "{}", ran.stdout);
    assert_eq!(ran.stdout["ips"][0]["address"], "198.18.61.11/24");
    assert!(!w.nat(&plain).contains("FERRY"), "{}", w.nat(&plain));
    assert!(!w.served(&plain));
    assert!(
        w.check_or_del("CHECK", &plain, ("plain", "other"), &ran.stdout)
            .ok
    );

    // The agent restarts: it serves its kept pods again and replays them to the node proxy.
    w.stop("agent");
    w.start("agent", &agent_args);
    w.wait_log("agent", "replay acknowledged", 1);
    assert!(
        w.log("agent").contains("node agent starting pods=1"),
        "{}",
        w.log("agent")
    );
    assert!(
        w.check_or_del("CHECK", &web, ("default", "web"), &web_result)
            .ok
    );
    assert!(w.served(&web));

    // With its node proxy gone, a pod whose capture rules were removed is reported by CHECK.
    w.stop("node");
    run(Command::new("ip").args([
        "netns",
        "exec",
        &web,
        "iptables",
        "-t",
        "nat",
        "-D",
        "OUTPUT",
        "-p",
        "tcp",
        "-j",
        "FERRY_OUT",
    ]));
    let ran = w.check_or_del("CHECK", &web, ("default", "web"), &web_result);
    assert!(!ran.ok);
    assert_eq!(ran.stdout["code"], 100, "{}", ran.stdout);
    assert!(
        ran.stdout["details"]
            .as_str()
            .unwrap_or("")
            .contains("OUTPUT does not jump to FERRY_OUT first"),
        "{}",
        ran.stdout
    );
    // A new node proxy is handed the pod by the agent's replay and puts its capture back.
    w.start("node", &node_args);
    assert!(
        eventually(DEADLINE, || w
            .check_or_del("CHECK", &web, ("default", "web"), &web_result)
            .ok),
        "CHECK after the node proxy came back: {}",
        w.check_or_del("CHECK", &web, ("default", "web"), &web_result)
            .stdout
    );

    // DEL releases the pod: no capture, no listener; a second DEL is fine too.
    assert!(
        w.check_or_del("DEL", &web, ("default", "web"), &web_result)
            .ok
    );
    assert!(
        eventually(DEADLINE, || !w.nat(&web).contains("FERRY")
            && !w.served(&web)),
        "{}",
        w.nat(&web)
    );
    assert!(
        w.check_or_del("DEL", &web, ("default", "web"), &web_result)
            .ok
    );
    let ferry = &w.conflist()["plugins"][1];
    let ran = w.plugin("CHECK", ferry, Some(&web_result), &web, ("default", "web"));
    assert!(
        !ran.ok,
        "a released pod of an enrolled namespace is not what CHECK expects"
    );
    assert_eq!(ran.stdout["code"], 101, "{}", ran.stdout);
}

/// The cluster the agent reads: `default` not enrolled yet, the pod `web` on node-1.
const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: default}
- apiVersion: v1
  kind: Pod
  metadata: {name: web, namespace: default, uid: u-web}
  spec: {nodeName: node-1, containers: [{name: web, image: web}]}
  status: {phase: Running}
"#;

#[test]
fn a_running_pod_is_captured_and_released_as_its_labels_in_the_api_server_change() {
    if !nix_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt.block_on(ApiServer::start(&[CLUSTER]));
    let mut w = World::new();
    let node_args = w.control_plane();
    let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
    w.start_kube_agent(&api);
    w.wait_log("agent", "node agent serving", 1);
    w.start("node", &node_args);
    w.wait_log("agent", "replay acknowledged", 1);
    let redirection = || {
        api.get("v1", "Pod", "default/web").unwrap()["metadata"]["annotations"]
            ["ambient.istio.io/redirection"]
            .as_str()
            .map(str::to_string)
    };

    // Its namespace not labelled: set up by the bridge, left alone by Ferry.
    let web = w.pod("web");
    let (ran, _) = w.add(&web, ("default", "web"));
    assert!(ran.ok, "ADD: {}\nagent:\n{}", ran.stdout, w.log("agent"));
    assert!(!w.nat(&web).contains("FERRY"), "{}", w.nat(&web));
    assert_eq!(redirection(), None);

    // The namespace labelled while the pod runs: captured, served and annotated.
    api.edit("v1", "Namespace", "/default", |o| {
        o["metadata"]["labels"] = json!({"istio.io/dataplane-mode": "ambient"});
    });
    assert!(
        eventually(DEADLINE, || w
            .nat(&web)
            .contains("-A OUTPUT -p tcp -j FERRY_OUT")
            && w.served(&web)),
        "not captured: {}\nagent:\n{}",
        w.nat(&web),
        w.log("agent")
    );
    assert!(
        eventually(DEADLINE, || redirection().as_deref() == Some("enabled")),
        "not annotated; agent:\n{}",
        w.log("agent")
    );

    // The pod opted out while it runs: released (no capture, no listener), the mark removed.
    api.edit("v1", "Pod", "default/web", |o| {
        o["metadata"]["labels"] = json!({"istio.io/dataplane-mode": "none"});
    });
    assert!(
        eventually(DEADLINE, || !w.nat(&web).contains("FERRY")
            && !w.served(&web)),
        "not released: {}\nagent:\n{}",
        w.nat(&web),
        w.log("agent")
    );
    assert!(
        eventually(DEADLINE, || redirection().is_none()),
        "annotation not removed; agent:\n{}",
        w.log("agent")
    );
    drop(w);
    api.stop();
}

/// The cluster of the pod that started before the agent: `default` enrolled, `web` running
/// with the address its sandbox got (198.18.62.10).
const STARTED_BEFORE: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: default, labels: {istio.io/dataplane-mode: ambient}}
- apiVersion: v1
  kind: Pod
  metadata: {name: web, namespace: default, uid: u-web}
  spec: {nodeName: node-1, containers: [{name: web, image: web}]}
  status: {phase: Running, podIP: 198.18.62.10, podIPs: [{ip: 198.18.62.10}]}
"#;

#[test]
fn a_pod_started_before_the_agent_is_found_by_its_address_and_captured() {
    if !nix_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt.block_on(ApiServer::start(&[STARTED_BEFORE]));
    let mut w = World::on(62);
    let node_args = w.control_plane();
    let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();

    // The pod's sandbox as the runtime made it before Ferry was there: its address from the
    // bridge alone, and its pause process in it.
    let web = w.pod("web");
    let bridge = w.conflist()["plugins"][0].clone();
    let ran = w.plugin("ADD", &bridge, None, &web, ("default", "web"));
    assert!(ran.ok, "bridge ADD: {}", ran.stdout);
    assert_eq!(ran.stdout["ips"][0]["address"], "198.18.62.10/24");
    let pause = ["netns", "exec", &web, "sleep", "infinity"];
    w.spawn("pause", Command::new("ip"), &pause);

    // A server outside the pod, in the node's namespace, on the bridge's address.
    let server = w.echo_server(&rt);

    // Then the agent and the node proxy: the agent finds the pod's namespace by its address
    // among the node's processes, and hands it over.
    w.start_kube_agent(&api);
    w.wait_log("agent", "node agent serving", 1);
    w.start("node", &node_args);
    w.wait_log(
        "agent",
        "a pod that started before the agent: its network namespace found by its IP",
        1,
    );
    assert!(
        eventually(DEADLINE, || w
            .nat(&web)
            .contains("-A OUTPUT -p tcp -j FERRY_OUT")
            && w.served(&web)),
        "not captured: {}\nagent:\n{}",
        w.nat(&web),
        w.log("agent")
    );
    assert!(
        eventually(
            DEADLINE,
            || api.get("v1", "Pod", "default/web").unwrap()["metadata"]["annotations"]["ambient.istio.io/redirection"]
                == "enabled"
        ),
        "not annotated; agent:\n{}",
        w.log("agent")
    );

    // A connection from the pod is carried by the node proxy.
    let mut conn = w.connect_from(&rt, &web, server);
    assert_eq!(
        echo(&mut conn, b"started before the agent"),
        b"started before the agent"
    );
    drop(conn);
    w.wait_log("node", "dst.addr=198.18.62.1:7070", 1);
    let log = w.log("node");
    let line = log
        .lines()
        .find(|l| l.contains("dst.addr=198.18.62.1:7070"))
        .unwrap();
    assert!(line.contains("src.addr=198.18.62.10:"), "{line}");
    drop(w);
    api.stop();
}

/// Sends `bytes` on `conn` and reads as many back (from the echo server).
fn echo(conn: &mut std::net::TcpStream, bytes: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    conn.write_all(bytes).unwrap();
    let mut back = vec![0; bytes.len()];
    conn.read_exact(&mut back).unwrap();
    back
}

#[test]
fn a_second_node_proxy_takes_the_pods_over_while_the_first_drains_and_connections_go_on() {
    if !nix_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut w = World::on(63);
    let node_args = w.control_plane();
    let agent_args = w.agent_args();
    let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    w.start("agent", &agent_args);
    w.wait_log("agent", "node agent serving", 1);
    let first: Vec<&str> = node_args.iter().map(String::as_str).collect();
    w.start("node", &first);
    w.wait_log("agent", "replay acknowledged", 1);
    let web = w.pod("web");
    let (ran, _) = w.add(&web, ("default", "web"));
    assert!(ran.ok, "ADD: {}\nagent:\n{}", ran.stdout, w.log("agent"));
    let server = w.echo_server(&rt);

    // A connection through the first node proxy, open across the upgrade.
    let mut open = w.connect_from(&rt, &web, server);
    assert_eq!(echo(&mut open, b"before"), b"before");

    // The second node proxy (as a DaemonSet surge starts it: its own admin port and files, the
    // same ZDS socket) takes the agent's replay and serves the pod beside the first.
    let mut second = node_args.clone();
    for (flag, value) in [
        ("--admin", "127.0.0.1:15100".to_string()),
        ("--state-file", w.path("node2.pods")),
    ] {
        let i = second.iter().position(|a| a == flag).unwrap() + 1;
        second[i] = value;
    }
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    w.start("node2", &second);
    w.wait_log("agent", "replay acknowledged", 2);
    let (one, two) = (w.pid("node"), w.pid("node2"));
    assert!(
        eventually(DEADLINE, || {
            let l = w.listeners(&web);
            l.contains(&one) && l.contains(&two)
        }),
        "both node proxies listen in the pod: {:?} (first {one}, second {two})",
        w.listeners(&web)
    );

    // The first drains: its open connection goes on meanwhile, and it exits once that ends.
    run(Command::new("kill").args(["-TERM", &one.to_string()]));
    assert_eq!(echo(&mut open, b"while draining"), b"while draining");
    drop(open);
    assert!(
        eventually(DEADLINE, || w.exited("node")),
        "the first node proxy did not exit:\n{}",
        w.log("node")
    );

    // The second carries new connections; the pod stays captured.
    let mut after = w.connect_from(&rt, &web, server);
    assert_eq!(echo(&mut after, b"after"), b"after");
    drop(after);
    w.wait_log("node2", &format!("dst.addr={server}"), 1);
    assert!(w.nat(&web).contains("-A OUTPUT -p tcp -j FERRY_OUT"));
    let left = w.listeners(&web);
    assert!(
        !left.is_empty() && left.iter().all(|p| *p == two),
        "only the second listens in the pod: {left:?} (second {two})"
    );
    // The agent kept the first's connection until it closed it: the two never took turns.
    assert_eq!(
        w.log("agent")
            .matches("node proxy connected; replaying")
            .count(),
        2,
        "{}",
        w.log("agent")
    );
    assert!(
        !w.log("node")
            .contains("the node agent closed the connection"),
        "{}",
        w.log("node")
    );
}

/// Root, asked of `id` as the lab tests do.
fn nix_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// On Kubernetes the node proxy's container has a read-only `/proc/sys`, so it cannot set
/// `tcp_fwmark_accept` (without it the app's side of connections from the client's address
/// replies through the pod's interface, MSS 1448) or `tcp_migrate_req` (handovers) in the pod:
/// the plugin, run on the host, sets them.
#[test]
fn the_plugin_sets_the_pods_sysctls_where_the_node_proxy_cannot_write_proc_sys() {
    if !nix_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let mut w = World::on(64);
    let node_args = w.control_plane();
    let agent_args = w.agent_args();
    let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    w.start("agent", &agent_args);
    w.wait_log("agent", "node agent serving", 1);
    // The node proxy as a container runs it: /proc/sys bound read-only in its own mounts.
    let mut node = w.in_host("unshare");
    node.args([
        "--mount",
        "--propagation",
        "slave",
        "sh",
        "-c",
        "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$0\" \"$@\"",
        FERRY,
    ]);
    let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
    w.spawn("node", node, &node_args);
    w.wait_log("agent", "replay acknowledged", 1);

    let web = w.pod("web");
    let (ran, _) = w.add(&web, ("default", "web"));
    assert!(ran.ok, "ADD: {}\nagent:\n{}", ran.stdout, w.log("agent"));
    assert!(w.served(&web), "the node proxy listens in the pod");
    // The node proxy tried and was refused ...
    w.wait_log("node", "tcp_fwmark_accept", 1);
    // ... and the plugin set it, and the handover's tcp_migrate_req.
    assert_eq!(sysctls(&web), "1\n1", "tcp_fwmark_accept, tcp_migrate_req");

    // A pod of a namespace not enrolled keeps the kernel's default.
    let plain = w.pod("plain");
    let (ran, _) = w.add(&plain, ("plain", "other"));
    assert!(ran.ok, "{}", ran.stdout);
    assert_eq!(sysctls(&plain), "0\n0");
}

/// `tcp_fwmark_accept` and `tcp_migrate_req` in the namespace `netns`, a line each.
fn sysctls(netns: &str) -> String {
    let out = run(Command::new("ip").args([
        "netns",
        "exec",
        netns,
        "sysctl",
        "-n",
        "net.ipv4.tcp_fwmark_accept",
        "net.ipv4.tcp_migrate_req",
    ]));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
