//! `up` and `down`: namespaces, links, addresses, processes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_core::model::TunnelProtocol;

use crate::state::{NodeProc, Pod, State};
use crate::{CONTROL_IP, MGMT_PREFIX};

/// The built-in default mesh.
pub const DEFAULT_TOPOLOGY: &str = include_str!("../../../examples/lab.yaml");

/// The ports every lab pod's echo app serves.
pub const APP_PORTS: [u16; 2] = [8080, 9090];

/// How to bring a lab up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Prefix of every namespace name; lets several labs coexist.
    pub id: String,
    pub state_dir: PathBuf,
    pub topology: Option<PathBuf>,
    /// The `ferry` binary to run inside the lab.
    pub ferry: PathBuf,
    /// Extra arguments for every node proxy.
    pub node_args: Vec<String>,
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    run(Command::new("ip").args(args))
}

/// Checks what the lab needs, and says exactly what is missing.
pub fn preflight() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "ferry lab needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces, veth \
             links and iptables rules; run it as root, or inside a user namespace made with \
             `unshare --user --map-root-user --net --mount`"
        );
    }
    for tool in ["ip", "iptables", "iptables-restore", "nsenter", "setsid"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        if !found {
            bail!("ferry lab needs `{tool}` (Debian packages: iproute2, iptables, util-linux)");
        }
    }
    Ok(())
}

fn netns(state: &mut State, name: String) -> anyhow::Result<String> {
    ip(&["netns", "add", &name])?;
    state.netns.push(name.clone());
    state.save()?;
    ip(&["-n", &name, "link", "set", "lo", "up"])?;
    Ok(name)
}

fn bridge(ns: &str) -> anyhow::Result<()> {
    ip(&["-n", ns, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", ns, "link", "set", "br0", "up"])
}

/// A veth from `host_ns` (as eth0, with `addr`) to the bridge in `bridge_ns` (as `port`).
fn attach(host_ns: &str, addr: &str, bridge_ns: &str, port: &str) -> anyhow::Result<()> {
    attach_named(host_ns, "eth0", addr, bridge_ns, port)
}

/// A veth from `host_ns` (as `ifname`, with `addr`) to the bridge in `bridge_ns` (as `port`).
fn attach_named(
    host_ns: &str,
    ifname: &str,
    addr: &str,
    bridge_ns: &str,
    port: &str,
) -> anyhow::Result<()> {
    ip(&[
        "link", "add", ifname, "netns", host_ns, "type", "veth", "peer", "name", port, "netns",
        bridge_ns,
    ])?;
    ip(&["-n", bridge_ns, "link", "set", port, "master", "br0", "up"])?;
    ip(&["-n", host_ns, "addr", "add", addr, "dev", ifname])?;
    ip(&["-n", host_ns, "link", "set", ifname, "up"])
}

/// Starts `args` inside `ns`, detached, logging to `log`. Returns its pid.
fn spawn(state: &mut State, ns: &str, args: &[&str], log: &Path) -> anyhow::Result<u32> {
    let out = std::fs::File::create(log)?;
    let child = Command::new("setsid")
        .args(["ip", "netns", "exec", ns])
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {args:?} in {ns}"))?;
    state.pids.push(child.id());
    state.save()?;
    Ok(child.id())
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> anyhow::Result<()> {
    let end = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > end {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}

/// Brings a lab up; on failure, takes down whatever was made.
pub fn up(opts: &Options) -> anyhow::Result<State> {
    preflight()?;
    if State::load(&opts.state_dir).is_some() {
        bail!(
            "a lab is already up in {} (run `ferry lab down` first)",
            opts.state_dir.display()
        );
    }
    let mut state = State {
        id: opts.id.clone(),
        dir: opts.state_dir.clone(),
        ..State::default()
    };
    std::fs::create_dir_all(&opts.state_dir)?;
    state.save()?;
    match build(opts, &mut state) {
        Ok(()) => Ok(state),
        Err(e) => {
            let _ = down(&opts.state_dir);
            Err(e)
        }
    }
}

fn build(opts: &Options, state: &mut State) -> anyhow::Result<()> {
    let text = match &opts.topology {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => DEFAULT_TOPOLOGY.to_string(),
    };
    let topo_path = opts.state_dir.join("topology.yaml");
    std::fs::write(&topo_path, &text)?;
    state.topology = topo_path.clone();
    let topo = ferry_topology::parse(&topo_path.display().to_string(), &text)?;
    let snap = &topo.snapshot;
    for w in snap.workloads() {
        for a in &w.addresses {
            if a.to_string().starts_with(&format!("{MGMT_PREFIX}.")) {
                bail!(
                    "workload {} uses {a}, inside the lab's reserved management network {MGMT_PREFIX}.0/24",
                    w.uid
                );
            }
        }
    }
    let id = &opts.id;
    let exe = opts.ferry.display().to_string();
    let dir = opts.state_dir.display().to_string();

    // Management network: the control plane and the node proxies.
    let mgmt = netns(state, format!("{id}-mgmt"))?;
    bridge(&mgmt)?;
    let ctl = netns(state, format!("{id}-ctl"))?;
    attach(&ctl, &format!("{CONTROL_IP}/24"), &mgmt, "ctl")?;

    // One bridge per mesh network.
    let mut networks: BTreeMap<String, String> = BTreeMap::new();
    for (k, c) in snap.clusters().enumerate() {
        if !networks.contains_key(c.network.as_str()) {
            let ns = netns(state, format!("{id}-net{k}"))?;
            bridge(&ns)?;
            networks.insert(c.network.to_string(), ns);
        }
    }

    // Pods: every workload with an address.
    let mut workloads: Vec<_> = snap
        .workloads()
        .filter(|w| !w.addresses.is_empty())
        .cloned()
        .collect();
    workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    for (j, w) in workloads.iter().enumerate() {
        let ns = netns(state, format!("{id}-p{j}"))?;
        let addr = format!("{}/15", w.addresses[0]);
        attach(&ns, &addr, &networks[w.network.as_str()], &format!("p{j}"))?;
        state.pods.insert(
            w.name.clone(),
            Pod {
                uid: w.uid.to_string(),
                netns: ns,
                ip: w.addresses[0].to_string(),
                node: w.node.as_ref().map(ToString::to_string),
                cluster: w.cluster.to_string(),
                enrolled: false,
                waypoint: false,
            },
        );
    }
    state.save()?;

    // Control plane.
    let control_dir = format!("{dir}/control");
    let status = Command::new(&exe)
        .args([
            "control",
            "bundle",
            "--state-dir",
            &control_dir,
            "--trust-domain",
            &topo.trust_domain,
        ])
        .stderr(Stdio::inherit())
        .output()?;
    if !status.status.success() {
        bail!("ferry control bundle failed");
    }
    let bundle = format!("{dir}/bundle.pem");
    std::fs::write(&bundle, &status.stdout)?;
    let control_log = opts.state_dir.join("control.log");
    let listen = format!("{CONTROL_IP}:15012");
    spawn(
        state,
        &ctl,
        &[
            &exe,
            "control",
            "serve",
            "--topology",
            &topo_path.display().to_string(),
            "--state-dir",
            &control_dir,
            "--listen",
            &listen,
            "--metrics-listen",
            &format!("{CONTROL_IP}:15014"),
        ],
        &control_log,
    )?;
    state.control_log = control_log.clone();
    state.control_addr = listen.clone();
    wait_for("the control plane", Duration::from_secs(20), || {
        std::fs::read_to_string(&control_log).is_ok_and(|l| l.contains("serving the CA and xDS"))
    })?;

    // Node proxies.
    for (i, n) in snap.nodes().enumerate() {
        let ns = netns(state, format!("{id}-h{i}"))?;
        let mgmt_ip = format!("{MGMT_PREFIX}.{}", 10 + i);
        attach(&ns, &format!("{mgmt_ip}/24"), &mgmt, &format!("h{i}"))?;
        let token = Command::new(&exe)
            .args([
                "control",
                "token",
                "--state-dir",
                &control_dir,
                "--node",
                n.name.as_str(),
            ])
            .output()?;
        if !token.status.success() {
            bail!("ferry control token failed for node {}", n.name);
        }
        let token_file = format!("{dir}/{}.token", n.name);
        std::fs::write(&token_file, &token.stdout)?;
        let api = opts.state_dir.join(format!("{}.sock", n.name));
        let log = opts.state_dir.join(format!("{}.log", n.name));
        let admin = format!("{mgmt_ip}:15000");
        let args: Vec<String> = [
            exe.as_str(),
            "node",
            "--name",
            n.name.as_str(),
            "--cluster",
            n.cluster.as_str(),
            "--control",
            &format!("https://{listen}"),
            "--token-file",
            &token_file,
            "--bundle-file",
            &bundle,
            "--api",
            &api.display().to_string(),
            "--admin",
            &admin,
            "--state-file",
            &opts
                .state_dir
                .join(format!("{}.pods", n.name))
                .display()
                .to_string(),
        ]
        .iter()
        .map(ToString::to_string)
        .chain(opts.node_args.iter().cloned())
        .collect();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let pid = spawn(state, &ns, &argv, &log)?;
        state.nodes.insert(
            n.name.to_string(),
            NodeProc {
                pid,
                args,
                netns: ns,
                mgmt_ip,
                api: api.clone(),
                admin,
                log,
                cluster: n.cluster.to_string(),
            },
        );
        state.save()?;
    }
    for n in state.nodes.values() {
        wait_for(
            &format!("the node proxy in {}", n.netns),
            Duration::from_secs(20),
            || n.api.exists(),
        )?;
    }

    // East-west gateways: on their own network, and reachable at their address from every other
    // network (an interface on each other network's bridge, with a route back to its pods).
    let gateways: Vec<_> = snap.gateways().cloned().collect();
    for (k, g) in gateways.iter().enumerate() {
        let gns = netns(state, format!("{id}-g{k}"))?;
        state.gateways.insert(g.name.clone(), gns.clone());
        attach_named(
            &gns,
            "mgmt",
            &format!("{MGMT_PREFIX}.{}/24", 100 + k),
            &mgmt,
            &format!("g{k}"),
        )?;
        let own = networks
            .get(g.network.as_str())
            .context("gateway network")?
            .clone();
        attach_named(
            &gns,
            "own",
            &format!("{}/15", g.address),
            &own,
            &format!("g{k}"),
        )?;
        // Replies go back out of the interface a connection came in on, so pod addresses may
        // repeat across networks: each interface marks what it receives, accepted sockets take
        // the mark of their SYN, and each mark routes through its own interface.
        run(Command::new("ip").args([
            "netns",
            "exec",
            &gns,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.tcp_fwmark_accept=1",
        ]))?;
        for (m, (net, net_ns)) in networks.iter().enumerate() {
            if net == g.network.as_str() {
                continue;
            }
            let ifname = format!("n{m}");
            attach_named(
                &gns,
                &ifname,
                &format!("{}/32", g.address),
                net_ns,
                &format!("g{k}n{m}"),
            )?;
            let mark = (m + 1).to_string();
            let table = (100 + m).to_string();
            run(Command::new("ip").args([
                "netns",
                "exec",
                &gns,
                "iptables",
                "-w",
                "-t",
                "mangle",
                "-A",
                "PREROUTING",
                "-i",
                &ifname,
                "-j",
                "MARK",
                "--set-mark",
                &mark,
            ]))?;
            ip(&["-n", &gns, "rule", "add", "fwmark", &mark, "lookup", &table])?;
            ip(&[
                "-n",
                &gns,
                "route",
                "add",
                "198.18.0.0/15",
                "dev",
                &ifname,
                "table",
                &table,
            ])?;
        }
        let token = Command::new(&exe)
            .args([
                "control",
                "token",
                "--state-dir",
                &control_dir,
                "--node",
                &format!("gateway.{}", g.name),
            ])
            .output()?;
        if !token.status.success() {
            bail!("ferry control token failed for gateway {}", g.name);
        }
        let token_file = format!("{dir}/gateway-{}.token", g.name);
        std::fs::write(&token_file, &token.stdout)?;
        let log = opts.state_dir.join(format!("gateway-{}.log", g.name));
        spawn(
            state,
            &gns,
            &[
                &exe,
                "gateway",
                "--name",
                &g.name,
                "--control",
                &format!("https://{listen}"),
                "--token-file",
                &token_file,
                "--bundle-file",
                &bundle,
            ],
            &log,
        )?;
        wait_for(
            &format!("gateway {}", g.name),
            Duration::from_secs(30),
            || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("serving HBONE")),
        )?;
    }

    // Apps, then enrollment.
    // Every port a service targets, so any service's traffic finds the app listening.
    let mut app_ports: std::collections::BTreeSet<u16> = APP_PORTS.into_iter().collect();
    for s in snap.services() {
        app_ports.extend(s.ports.iter().map(|p| p.target_port));
    }
    for w in snap.workloads() {
        app_ports.extend(w.services.values().flatten().map(|p| p.target_port));
    }
    app_ports.retain(|p| {
        *p != 0
            && *p != crate::apps::SINK_PORT
            && *p != crate::apps::HTTP_PORT
            && ![15001, 15006, 15008].contains(p)
    });
    let ports = app_ports
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let pods: Vec<(String, String)> = state
        .pods
        .iter()
        .map(|(n, p)| (n.clone(), p.netns.clone()))
        .collect();
    for (name, ns) in pods {
        let log = opts.state_dir.join(format!("app-{name}.log"));
        spawn(
            state,
            &ns,
            &[&exe, "lab", "echo", "--name", &name, "--ports", &ports],
            &log,
        )?;
    }
    // Waypoint instances run `ferry waypoint` in their own namespace (with their node's
    // credential); they terminate HBONE themselves and are not captured.
    let waypoint_keys: std::collections::HashSet<_> = snap
        .services()
        .filter(|s| s.waypoint_for.is_some())
        .map(|s| s.key())
        .collect();
    let is_waypoint =
        |w: &ferry_core::model::Workload| w.services.keys().any(|k| waypoint_keys.contains(k));
    for w in workloads.iter().filter(|w| is_waypoint(w)) {
        let Some(node) = &w.node else { continue };
        let pod = state.pods.get(&w.name).context("pod state")?;
        let pod_ns = format!("/var/run/netns/{}", pod.netns);
        // In its node's namespace (to reach the control plane), serving inside the pod's.
        let ns = state
            .nodes
            .get(node.as_str())
            .context("node state")?
            .netns
            .clone();
        let log = opts.state_dir.join(format!("waypoint-{}.log", w.name));
        let token_file = format!("{dir}/{node}.token");
        // Admin (`/metrics`) on the pod's own address, port 15020.
        let admin = format!("{}:15020", pod.ip);
        spawn(
            state,
            &ns,
            &[
                &exe,
                "waypoint",
                "--uid",
                w.uid.as_str(),
                "--cluster",
                w.cluster.as_str(),
                "--control",
                &format!("https://{listen}"),
                "--token-file",
                &token_file,
                "--bundle-file",
                &bundle,
                "--netns",
                &pod_ns,
                "--admin",
                &admin,
            ],
            &log,
        )?;
        if let Some(p) = state.pods.get_mut(&w.name) {
            p.waypoint = true;
        }
        wait_for(
            &format!("waypoint {}", w.name),
            Duration::from_secs(30),
            || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("serving HBONE")),
        )?;
    }
    for w in &workloads {
        let Some(node) = &w.node else { continue };
        if w.tunnel != TunnelProtocol::Hbone || is_waypoint(w) {
            continue;
        }
        let pod = state.pods.get(&w.name).context("pod state")?;
        let api = &state.nodes[node.as_str()].api;
        let answer = api_call(
            api,
            &format!("add {} /var/run/netns/{}", pod.uid, pod.netns),
        )?;
        if answer.trim() != "ok" {
            bail!("enrolling {} on {node}: {}", w.name, answer.trim());
        }
        if let Some(p) = state.pods.get_mut(&w.name) {
            p.enrolled = true;
        }
    }
    state.save()?;
    Ok(())
}

/// One request to a node proxy's enrollment API.
pub fn api_call(socket: &Path, line: &str) -> anyhow::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    Ok(answer)
}

/// Removes everything a lab made. Safe to run twice, and after a partial `up`.
pub fn down(state_dir: &Path) -> anyhow::Result<bool> {
    let Some(state) = State::load(state_dir) else {
        return Ok(false);
    };
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for &pid in &state.pids {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    let end = Instant::now() + Duration::from_secs(5);
    for &pid in &state.pids {
        while kill(Pid::from_raw(pid as i32), None).is_ok() && Instant::now() < end {
            // Reap if it is our child; otherwise just wait for it to go.
            let _ = nix::sys::wait::waitpid(
                Pid::from_raw(pid as i32),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    for ns in state.netns.iter().rev() {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
    std::fs::remove_dir_all(state_dir)
        .with_context(|| format!("removing {}", state_dir.display()))?;
    Ok(true)
}

/// Restarts one node proxy (SIGTERM and drain, or with `kill`, SIGKILL at once). The new
/// process serves the node's pods again from its own enrollment state: nothing is re-enrolled.
pub fn restart_node(state_dir: &Path, node: &str, kill: bool) -> anyhow::Result<()> {
    stop_node(state_dir, node, kill)?;
    start_node(state_dir, node)
}

/// Stops one node proxy: SIGTERM and wait for its drain, or SIGKILL. Its pods stay enrolled
/// and captured: their traffic is refused until a node proxy serves them again.
pub fn stop_node(state_dir: &Path, node: &str, kill: bool) -> anyhow::Result<()> {
    let state = State::load(state_dir).context("no lab is up")?;
    let n = state
        .nodes
        .get(node)
        .with_context(|| format!("no node {node}"))?;
    if kill {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(n.pid as i32);
        let _ = kill(pid, Signal::SIGKILL);
        wait_for(
            "the killed node proxy to exit",
            Duration::from_secs(10),
            || {
                let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
                kill(pid, None).is_err()
            },
        )
    } else {
        stop_and_wait(n.pid, "the old node proxy to exit", Duration::from_secs(40))
    }
}

/// Starts a node proxy for `node` (which must not be running) and waits until it serves every
/// pod enrolled on the node.
pub fn start_node(state_dir: &Path, node: &str) -> anyhow::Result<()> {
    let mut state = State::load(state_dir).context("no lab is up")?;
    let n = state
        .nodes
        .get(node)
        .with_context(|| format!("no node {node}"))?;
    let (netns, api, log, args) = (
        n.netns.clone(),
        n.api.clone(),
        n.log.clone(),
        n.args.clone(),
    );
    let _ = std::fs::remove_file(&api);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut logfile = std::fs::OpenOptions::new().append(true).open(&log)?;
    writeln!(logfile, "--- started again by ferry lab ---")?;
    let pid = spawn_append(&mut state, &netns, &argv, &log)?;
    if let Some(n) = state.nodes.get_mut(node) {
        n.pid = pid;
    }
    state.save()?;
    wait_for("the restarted node proxy", Duration::from_secs(20), || {
        api.exists()
    })?;
    wait_served(&state, node, &api)
}

/// Waits until the node proxy behind `api` serves every pod enrolled on `node` (restored from
/// its own state; nothing is enrolled again).
fn wait_served(state: &State, node: &str, api: &Path) -> anyhow::Result<()> {
    let expected: Vec<String> = state
        .pods
        .values()
        .filter(|p| p.enrolled && p.node.as_deref() == Some(node))
        .map(|p| p.uid.clone())
        .collect();
    wait_for(
        "the node proxy to serve its enrolled pods again",
        Duration::from_secs(30),
        || {
            api_list(api)
                .is_ok_and(|served| expected.iter().all(|u| served.iter().any(|(s, _)| s == u)))
        },
    )
}

/// The pods a node proxy serves: (uid, netns path).
pub fn api_list(socket: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"list\n")?;
    let mut out = Vec::new();
    for line in BufReader::new(s).lines() {
        let line = line?;
        if line == "end" {
            return Ok(out);
        }
        if let Some((u, p)) = line.split_once(' ') {
            out.push((u.to_string(), p.to_string()));
        }
    }
    anyhow::bail!("the list ended without `end`")
}

fn spawn_append(state: &mut State, ns: &str, args: &[&str], log: &Path) -> anyhow::Result<u32> {
    let out = std::fs::OpenOptions::new().append(true).open(log)?;
    let child = Command::new("setsid")
        .args(["ip", "netns", "exec", ns])
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    state.pids.push(child.id());
    state.save()?;
    Ok(child.id())
}

/// Hands a node's pods over to a new node proxy process without refusing a connection: the new
/// process reads the node's enrollment state, opens its listeners beside the old one's
/// (SO_REUSEPORT) and keeps the capture rules as they are; only then does the old one drain and
/// exit (its queued connections migrate).
pub fn handover(state_dir: &Path, node: &str) -> anyhow::Result<()> {
    let mut state = State::load(state_dir).context("no lab is up")?;
    let n = state
        .nodes
        .get(node)
        .with_context(|| format!("no node {node}"))?;
    let (old, netns, log, mut args) = (n.pid, n.netns.clone(), n.log.clone(), n.args.clone());
    let api = state_dir.join(format!("{node}.{}.sock", state.pids.len()));
    if let Some(i) = args.iter().position(|a| a == "--api") {
        args[i + 1] = api.display().to_string();
    }
    // The old process still holds its admin port: the new one takes the next.
    let mut admin = None;
    if let Some(i) = args.iter().position(|a| a == "--admin") {
        let (ip, port) = args[i + 1].rsplit_once(':').context("admin address")?;
        let next = format!("{ip}:{}", port.parse::<u16>()? + 1);
        args[i + 1].clone_from(&next);
        admin = Some(next);
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut logfile = std::fs::OpenOptions::new().append(true).open(&log)?;
    writeln!(
        logfile,
        "--- handover: a new node proxy starts beside the old one ---"
    )?;
    let pid = spawn_append(&mut state, &netns, &argv, &log)?;
    wait_for("the new node proxy", Duration::from_secs(20), || {
        api.exists()
    })?;
    // It serves the node's pods from the shared enrollment state, beside the old one.
    wait_served(&state, node, &api)?;
    // Only now does the old one stop accepting and drain.
    stop_and_wait(
        old,
        "the old node proxy to drain and exit",
        Duration::from_secs(60),
    )?;
    if let Some(n) = state.nodes.get_mut(node) {
        n.pid = pid;
        n.api = api;
        n.args = args;
        if let Some(a) = admin {
            n.admin = a;
        }
    }
    state.save()?;
    Ok(())
}

/// Sends SIGTERM to `pid` and waits (reaping it if it is our child) until it is gone.
fn stop_and_wait(pid: u32, what: &str, max: Duration) -> anyhow::Result<()> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let pid = Pid::from_raw(pid as i32);
    let _ = kill(pid, Signal::SIGTERM);
    wait_for(what, max, || {
        let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        kill(pid, None).is_err()
    })
}
