//! `ferry cni` as the runtime runs it: a chained plugin (after the interface and IPAM plugins)
//! that hands each pod of an enrolled namespace to the node agent, which hands it to the node
//! proxy over ZDS and answers once the node proxy has put the pod's capture in place. A pod the
//! node proxy cannot take fails to start (fail closed), as Istio's plugin does.
//!
//! - ADD: asks the agent, then prints the previous plugins' result unchanged. For a pod the
//!   agent enrolled it also sets [`POD_SYSCTLS`] in the pod's namespace, which the node proxy
//!   cannot where its container's `/proc/sys` is read-only.
//! - DEL: asks the agent to release the pod; succeeds when the agent does not know it, and when
//!   the agent cannot be reached (the spec asks DEL to clean up what it can, not to fail on
//!   what is gone).
//! - CHECK: the pod's namespace enrolled means the agent holds it, a node proxy serves it, and
//!   the pod's nat table jumps to Ferry's capture chains first.
//! - VERSION: the versions spoken.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command as Process;
use std::time::Duration;

use crate::spec::{self, CniError, Command, Invocation, NetConf, code};
use crate::wire::{Answer, Ask};

/// How long the plugin waits for the agent, which waits for the node proxy's ack.
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings the node proxy makes in an enrolled pod's namespace where it can (its container's
/// `/proc/sys` is read-only on Kubernetes); the plugin runs on the host, where `/proc/sys` is
/// writable, so it is what makes them there:
/// - `tcp_fwmark_accept`: the app's accepted socket carries its SYN's mark, so the node proxy's
///   connections to the app from the client's address reply by loopback (table 133) instead of
///   the pod's interface (MSS 1448 instead of 65483, and a route lookup per packet;
///   node/src/transparent.rs);
/// - `tcp_migrate_req`: a handover moves connections queued on the old node proxy's listeners to
///   the new one's instead of resetting them (node/src/capture.rs).
pub const POD_SYSCTLS: [&str; 2] = ["net.ipv4.tcp_fwmark_accept=1", "net.ipv4.tcp_migrate_req=1"];

/// Runs one invocation with this process's environment, stdin and stdout; returns the exit code.
pub fn run() -> u8 {
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let version = serde_json::from_slice::<serde_json::Value>(&stdin)
        .ok()
        .and_then(|v| v["cniVersion"].as_str().map(str::to_string));
    let outcome = read
        .map_err(|e| CniError::new(code::IO_FAILURE, "cannot read stdin", e.to_string()))
        .and_then(|_| invoke(|k| std::env::var(k).ok(), &stdin));
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(Some(v)) => {
            let _ = writeln!(out, "{v}");
            0
        }
        Ok(None) => 0,
        Err(e) => {
            let _ = writeln!(out, "{}", e.to_json(version.as_deref()));
            1
        }
    }
}

/// One invocation: what to print on success (ADD and VERSION print, DEL and CHECK do not).
pub fn invoke(
    var: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
) -> Result<Option<serde_json::Value>, CniError> {
    let inv = Invocation::from_env(var)?;
    if inv.command == Command::Version {
        let version = serde_json::from_slice::<serde_json::Value>(stdin)
            .ok()
            .and_then(|v| v["cniVersion"].as_str().map(str::to_string));
        return Ok(Some(spec::version_json(version.as_deref())));
    }
    let conf = spec::parse_conf(stdin)?;
    match inv.command {
        Command::Add => add(&inv, &conf).map(Some),
        Command::Del => {
            del(&inv, &conf);
            Ok(None)
        }
        Command::Check => check(&inv, &conf).map(|()| None),
        // Answered above without a configuration; the same answer with one.
        Command::Version => Ok(Some(spec::version_json(Some(&conf.cni_version)))),
    }
}

fn add(inv: &Invocation, conf: &NetConf) -> Result<serde_json::Value, CniError> {
    let result = spec::add_result(conf)?;
    // `from_env` requires the namespace for ADD.
    let netns = inv.netns.clone().unwrap_or_default();
    let answer = ask(
        &conf.agent_socket,
        &Ask::Add {
            pod: inv.pod.clone(),
            container_id: inv.container_id.clone(),
            netns,
            // The enroller's setting, never a plugin's: every inbound port captured.
            uncaptured: Vec::new(),
        },
    )?;
    if !answer.error.is_empty() {
        return Err(CniError::new(
            code::NOT_ENROLLED,
            "the node agent did not enroll the pod",
            answer.error,
        ));
    }
    if answer.enrolled {
        // Best effort, as the node proxy's: without it the pod works, with slower bulk replies.
        if let Err(e) = pod_sysctls(inv.netns.as_deref().unwrap_or(Path::new(""))) {
            eprintln!("ferry-cni: ADD: cannot set {POD_SYSCTLS:?} in the pod's namespace: {e}");
        }
    }
    Ok(result)
}

/// Sets [`POD_SYSCTLS`] in the namespace at `netns`: what went wrong, if it did.
fn pod_sysctls(netns: &Path) -> Result<(), String> {
    let out = Process::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["sysctl", "-q", "-w"])
        .args(POD_SYSCTLS)
        .output()
        .map_err(|e| format!("cannot run nsenter/sysctl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn del(inv: &Invocation, conf: &NetConf) {
    let asked = ask(
        &conf.agent_socket,
        &Ask::Del {
            pod: inv.pod.clone(),
            container_id: inv.container_id.clone(),
        },
    );
    match asked {
        Ok(a) if a.error.is_empty() => {}
        Ok(a) => eprintln!("ferry-cni: DEL: the node agent answered: {}", a.error),
        Err(e) => eprintln!("ferry-cni: DEL: {e}"),
    }
}

fn check(inv: &Invocation, conf: &NetConf) -> Result<(), CniError> {
    let answer = ask(
        &conf.agent_socket,
        &Ask::Check {
            pod: inv.pod.clone(),
            container_id: inv.container_id.clone(),
        },
    )?;
    if !answer.error.is_empty() {
        return Err(CniError::new(
            code::NOT_ENROLLED,
            "the pod is not enrolled as its namespace says",
            answer.error,
        ));
    }
    if !answer.enrolled {
        // Not in an enrolled namespace: nothing of Ferry's to check.
        return Ok(());
    }
    // The rules first: they are what keeps the pod's traffic in the mesh, node proxy or not.
    let netns = inv.netns.as_deref().unwrap_or(Path::new(""));
    let saved = nat_table(netns)?;
    capture_in_place(&saved).map_err(|missing| {
        CniError::new(
            code::CAPTURE_MISSING,
            "the pod's capture rules are not in place",
            missing,
        )
    })?;
    if !answer.served {
        return Err(CniError::new(
            code::TRY_AGAIN_LATER,
            "no node proxy serves the pod",
            "the node agent has no node proxy connected",
        ));
    }
    Ok(())
}

/// The nat table of the namespace at `netns`, as `iptables-save` prints it.
fn nat_table(netns: &Path) -> Result<String, CniError> {
    let out = Process::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["iptables-save", "-t", "nat"])
        .output()
        .map_err(|e| {
            CniError::new(
                code::IO_FAILURE,
                "cannot run nsenter/iptables-save",
                e.to_string(),
            )
        })?;
    if !out.status.success() {
        return Err(CniError::new(
            code::IO_FAILURE,
            "iptables-save failed in the pod's namespace",
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether each hook of the pod's nat table sends TCP to Ferry's chain first and that chain
/// redirects to the node proxy; else what is missing. (The node proxy keeps the chains' exact
/// contents; this is what CHECK can tell from outside.)
pub fn capture_in_place(saved: &str) -> Result<(), String> {
    let mut missing = Vec::new();
    for (hook, chain) in [("OUTPUT", "FERRY_OUT"), ("PREROUTING", "FERRY_IN")] {
        let hook_prefix = format!("-A {hook} ");
        let first = saved
            .lines()
            .find_map(|l| l.trim_end().strip_prefix(hook_prefix.as_str()));
        if first != Some(format!("-p tcp -j {chain}").as_str()) {
            missing.push(format!("{hook} does not jump to {chain} first"));
        }
        let chain_prefix = format!("-A {chain} ");
        let redirects = saved.lines().any(|l| {
            l.strip_prefix(chain_prefix.as_str())
                .is_some_and(|r| r.contains("-j REDIRECT"))
        });
        if !redirects {
            missing.push(format!("{chain} redirects nothing"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join("; "))
    }
}

/// Asks the agent at `socket` one question.
fn ask(socket: &Path, q: &Ask) -> Result<Answer, CniError> {
    let unreachable = |e: std::io::Error| {
        CniError::new(
            code::TRY_AGAIN_LATER,
            "cannot reach the node agent",
            format!("{}: {e}", socket.display()),
        )
    };
    let mut s = UnixStream::connect(socket).map_err(unreachable)?;
    s.set_read_timeout(Some(AGENT_TIMEOUT))
        .map_err(unreachable)?;
    let mut line = serde_json::to_string(q).map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            "cannot encode the question",
            e.to_string(),
        )
    })?;
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(unreachable)?;
    let mut answer = String::new();
    BufReader::new(s)
        .read_line(&mut answer)
        .map_err(unreachable)?;
    serde_json::from_str(&answer).map_err(|e| {
        CniError::new(
            code::DECODE_FAILURE,
            "the node agent's answer is not JSON",
            format!("{e}: {answer:?}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPTURED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:FERRY_IN - [0:0]\n:FERRY_OUT - [0:0]\n-A PREROUTING -p tcp -j FERRY_IN\n-A OUTPUT -p tcp -j FERRY_OUT\n-A FERRY_IN -p tcp -m tcp --dport 15008 -j RETURN\n-A FERRY_IN -p tcp -j REDIRECT --to-ports 15006\n-A FERRY_OUT -m mark --mark 0x539/0xfff -j RETURN\n-A FERRY_OUT -d 127.0.0.0/8 -j RETURN\n-A FERRY_OUT -p tcp -j REDIRECT --to-ports 15001\nCOMMIT\n";

    #[test]
    fn capture_is_in_place_only_with_both_jumps_first_and_redirects() {
        assert_eq!(capture_in_place(CAPTURED), Ok(()));
        let flushed = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
        let e = capture_in_place(flushed).unwrap_err();
        assert!(
            e.contains("OUTPUT does not jump to FERRY_OUT first")
                && e.contains("FERRY_IN redirects nothing"),
            "{e}"
        );
        let shadowed = CAPTURED.replace(
            "-A OUTPUT -p tcp -j FERRY_OUT\n",
            "-A OUTPUT -d 198.18.0.0/15 -j ACCEPT\n-A OUTPUT -p tcp -j FERRY_OUT\n",
        );
        assert!(capture_in_place(&shadowed).is_err());
    }

    #[test]
    fn version_needs_no_configuration_and_add_without_an_agent_asks_to_try_again() {
        let v = invoke(|k| (k == "CNI_COMMAND").then(|| "VERSION".to_string()), b"")
            .unwrap()
            .unwrap();
        assert!(v["supportedVersions"].as_array().unwrap().len() >= 2);
        let dir = std::env::temp_dir().join(format!("ferry-cni-noagent-{}", std::process::id()));
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","type":"ferry-cni","agent_socket":"{}","prevResult":{{"cniVersion":"1.0.0"}}}}"#,
            dir.join("missing.sock").display()
        );
        let env = |k: &str| {
            match k {
                "CNI_COMMAND" => Some("ADD"),
                "CNI_CONTAINERID" => Some("c1"),
                "CNI_NETNS" => Some("/var/run/netns/none"),
                "CNI_IFNAME" => Some("eth0"),
                _ => None,
            }
            .map(str::to_string)
        };
        let e = invoke(env, conf.as_bytes()).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        // DEL with the agent gone succeeds (nothing to release that anyone holds).
        let del = |k: &str| {
            if k == "CNI_COMMAND" {
                Some("DEL".into())
            } else {
                env(k)
            }
        };
        assert_eq!(invoke(del, conf.as_bytes()), Ok(None));
    }
}
