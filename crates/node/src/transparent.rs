//! The rules in a pod's namespace that let the node proxy connect to the app from the
//! original client's address (`IP_TRANSPARENT`, [`ferry_runtime::netns::Netns::connect_from`]),
//! as istio-cni sets them up for ztunnel, with Istio's marks, and one rule and one setting more
//! (the `MARK` and the sysctl, below):
//!
//! ```text
//!   mangle PREROUTING -p tcp -> FERRY_ORIG_PRE: marked by the proxy (0x539), arriving on lo
//!                                               -> CONNMARK 0x111 (a connection the proxy made
//!                                                  to the pod itself)
//!                                               -> MARK 0x111 (the packet itself)
//!   mangle OUTPUT     -p tcp -> FERRY_ORIG_OUT: its connection marked 0x111 -> restore the mark
//!   ip rule fwmark 0x111/0xfff pref 32764 lookup 133
//!   ip route local 0.0.0.0/0 dev lo table 133
//!   sysctl net.ipv4.tcp_fwmark_accept=1
//! ```
//!
//! The app's replies to the client's address carry mark 0x111, so they are routed to the local
//! stack (table 133) and reach the proxy's transparent socket instead of leaving by the pod's
//! interface. Connections the proxy opens elsewhere (tunnels to other pods) never pass the pod's
//! PREROUTING with the proxy's mark, so they are untouched, and so are the app's own
//! connections.
//!
//! Beyond istio-cni's rules, the proxy's packets arriving on lo also get mark 0x111 themselves
//! (`MARK`, after the `CONNMARK`), and `net.ipv4.tcp_fwmark_accept=1` (both families) makes the
//! app's socket accepted from such a SYN carry it. Its route is then table 133's `local ... dev
//! lo` from the SYN-ACK on. Without them the accepted socket routes by the main table, through
//! the pod's interface: an MSS of 1448 (MTU 1500) on a loopback connection that otherwise takes
//! 65483, so bulk data towards the app moves in 45 times as many segments, and each of the app's
//! packets is routed again when OUTPUT restores the mark. Measured (`ferry lab bench`, release
//! builds, issue 17): the node proxies' CPU per 64 B round trip 127 us without them against 62 us
//! with them (66 us before the original-source rules existed), per new connection 940 against
//! 775 us (850 us), per GB 3.07 against 2.89 s (2.87 s); see docs/hbone.md. Where the sysctl cannot be written (a container's
//! read-only `/proc/sys`), connections work as before, at that cost.
//!
//! Each IP family has its own: the mangle chains in `iptables` and in `ip6tables`, the routing
//! rule and the local route (`local ::/0 dev lo table 133`) in `ip -4` and in `ip -6`. A pod whose
//! namespace has IPv6 disabled gets the IPv4 half only ([`crate::pods`] decides).
//!
//! They go and come with the capture rules: installed at enrollment, compared whenever the
//! namespace's nf_tables ruleset (the chains) or its routing rules and routes change, rewritten
//! on a difference, removed with the pod. A pod whose rules are not in place is connected from
//! its own address (the connect would otherwise wait for replies that leave the pod).

use std::path::Path;

use ferry_runtime::netns::{MARK, Netns};
use nix::sys::socket::SockProtocol;
use tokio::process::Command;

use crate::capture::{self, RuleChanges};
use crate::family::Family;

/// Why the rules could not be read or changed.
#[derive(Debug, thiserror::Error)]
#[error("original-source rules in {netns}: {detail}")]
pub(crate) struct TransparentError {
    pub netns: String,
    pub detail: String,
}

impl From<capture::CaptureError> for TransparentError {
    fn from(e: capture::CaptureError) -> Self {
        Self {
            netns: e.netns,
            detail: format!("{}: {}", e.tool, e.detail),
        }
    }
}

/// The connection mark of the proxy's connections to the pod itself (Istio's in-pod TPROXY mark).
pub(crate) const ORIGIN_MARK: u32 = 0x111;
/// The bits of the mark Ferry's marks use.
const MASK: u32 = 0xfff;
/// The routing table that delivers marked replies locally.
pub(crate) const ROUTE_TABLE: u32 = 133;
/// The priority of the rule that selects it (before `main`, 32766).
const RULE_PRIORITY: u32 = 32764;
/// Accepted sockets take their SYN's mark (for IPv4 and IPv6 alike); see the module's text.
const FWMARK_ACCEPT: &str = "net.ipv4.tcp_fwmark_accept";

/// The mangle chains, with their rules as `iptables-save` prints them.
fn chains() -> [(&'static str, &'static str, Vec<String>); 2] {
    [
        (
            "PREROUTING",
            "FERRY_ORIG_PRE",
            vec![
                format!(
                    "-m mark --mark {MARK:#x}/{MASK:#x} -j CONNMARK --set-xmark {ORIGIN_MARK:#x}/{MASK:#x}"
                ),
                format!(
                    "-m mark --mark {MARK:#x}/{MASK:#x} -j MARK --set-xmark {ORIGIN_MARK:#x}/{MASK:#x}"
                ),
            ],
        ),
        (
            "OUTPUT",
            "FERRY_ORIG_OUT",
            vec![format!(
                "-m connmark --mark {ORIGIN_MARK:#x}/{MASK:#x} -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff"
            )],
        ),
    ]
}

/// The routing rule, as `ip -4 rule show` (and `ip -6`) prints it (whitespace aside).
fn rule_line() -> String {
    format!("{RULE_PRIORITY}: from all fwmark {ORIGIN_MARK:#x}/{MASK:#x} lookup {ROUTE_TABLE}")
}

/// The one route of [`ROUTE_TABLE`], as `ip -4 route show table` (`ip -6`) prints it.
fn route_line(family: Family) -> &'static str {
    match family {
        Family::V4 => "local default dev lo scope host",
        Family::V6 => "local default dev lo metric 1024 pref medium",
    }
}

fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How the pod's rules of `family` differ from these, if they do: `mangle` (its mangle table as
/// `iptables-save` prints it), `rules` (`ip -4 rule show`) and `routes` (`ip -4 route show
/// table 133`), or the same of IPv6. The chains as the capture's ([`capture::drift_of`]); the
/// routing rule present once; the table holding the one local route.
pub(crate) fn drift(family: Family, mangle: &str, rules: &str, routes: &str) -> Option<String> {
    let mut found: Vec<String> = capture::drift_of(mangle, &chains()).into_iter().collect();
    let want = rule_line();
    let n = rules.lines().filter(|l| words(l) == want).count();
    if n != 1 {
        found.push(format!("the routing rule '{want}' is there {n} time(s)"));
    }
    let table: Vec<String> = routes
        .lines()
        .map(words)
        .filter(|l| !l.is_empty())
        .collect();
    let route = route_line(family);
    if table != [route] {
        found.push(format!(
            "table {ROUTE_TABLE} holds {} route(s), not only '{route}'",
            table.len()
        ));
    }
    (!found.is_empty()).then(|| found.join("; "))
}

fn ip(netns: &Path, args: &[&str]) -> Command {
    let mut c = capture::nsenter(netns);
    c.arg("ip").args(args);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// Runs `ip <args>` in the pod's namespace: its output, or what it said went wrong.
async fn run_ip(netns: &Path, args: &[&str]) -> Result<String, TransparentError> {
    let err = |detail: String| TransparentError {
        netns: netns.display().to_string(),
        detail: format!("ip {}: {detail}", args.join(" ")),
    };
    let out = ip(netns, args)
        .output()
        .await
        .map_err(|e| err(format!("cannot run nsenter/ip: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }
}

/// What [`drift`] compares, read from the pod's namespace. A routing table that does not
/// exist yet holds no route.
async fn read(netns: &Path, family: Family) -> Result<(String, String, String), TransparentError> {
    let table = ROUTE_TABLE.to_string();
    let f = family.ip_flag();
    let routes = match run_ip(netns, &[f, "route", "show", "table", &table]).await {
        Err(e) if e.detail.contains("table does not exist") => String::new(),
        r => r?,
    };
    Ok((
        capture::saved_table(netns, family, "mangle").await?,
        run_ip(netns, &[f, "rule", "show"]).await?,
        routes,
    ))
}

/// How the pod's rules of `family` differ from Ferry's, if they do; rules that cannot be read
/// differ.
pub(crate) async fn check(netns: &Path, family: Family) -> Option<String> {
    match read(netns, family).await {
        Ok((mangle, rules, routes)) => drift(family, &mangle, &rules, &routes),
        Err(e) => Some(e.to_string()),
    }
}

/// The arguments of the routing rule, after `ip -4 rule add|del` (`ip -6`).
fn rule_args() -> Vec<String> {
    vec![
        "fwmark".into(),
        format!("{ORIGIN_MARK:#x}/{MASK:#x}"),
        "pref".into(),
        RULE_PRIORITY.to_string(),
        "lookup".into(),
        ROUTE_TABLE.to_string(),
    ]
}

/// Makes the pod's rules Ferry's, unless they already are (a handover leaves the previous node
/// proxy's in place): the chains in one `iptables-restore` transaction (as the capture's), the
/// table's route replaced and any other flushed, the routing rule put there once.
pub(crate) async fn install(netns: &Path, family: Family) -> Result<(), TransparentError> {
    if let Err(detail) = fwmark_accept(netns, true).await {
        tracing::info!(netns = %netns.display(), sysctl = FWMARK_ACCEPT, error = %detail, "cannot set; the app's side of connections from the client's address keeps the pod interface's MSS (slower bulk transfers)");
    }
    let (mangle, rules, routes) = read(netns, family).await?;
    if drift(family, &mangle, &rules, &routes).is_none() {
        return Ok(());
    }
    let script = capture::rewrite_of("mangle", &mangle, &chains());
    capture::restore(netns, family, &script).await?;
    let table = ROUTE_TABLE.to_string();
    let f = family.ip_flag();
    if !routes.trim().is_empty() && words(&routes) != route_line(family) {
        run_ip(netns, &[f, "route", "flush", "table", &table]).await?;
    }
    run_ip(
        netns,
        &[
            f,
            "route",
            "replace",
            "local",
            family.any(),
            "dev",
            "lo",
            "table",
            &table,
        ],
    )
    .await?;
    let rule = rule_args();
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    let want = rule_line();
    let present = rules.lines().filter(|l| words(l) == want).count();
    if present != 1 {
        for _ in 0..present {
            run_ip(netns, &[&[f, "rule", "del"], &rule[..]].concat()).await?;
        }
        run_ip(netns, &[&[f, "rule", "add"], &rule[..]].concat()).await?;
    }
    Ok(())
}

/// Sets [`FWMARK_ACCEPT`] in the pod's namespace (`sysctl`, as the capture sets
/// `tcp_migrate_req`): what it said went wrong, if it did.
async fn fwmark_accept(netns: &Path, on: bool) -> Result<(), String> {
    let setting = format!("{FWMARK_ACCEPT}={}", u8::from(on));
    let out = capture::nsenter(netns)
        .args(["sysctl", "-q", "-w", &setting])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .map_err(|e| format!("cannot run nsenter/sysctl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Removes the pod's rules of `family`; missing ones are not an error.
pub(crate) async fn remove(netns: &Path, family: Family) {
    let _ = fwmark_accept(netns, false).await;
    let rule = rule_args();
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    let f = family.ip_flag();
    for _ in 0..8 {
        if run_ip(netns, &[&[f, "rule", "del"], &rule[..]].concat())
            .await
            .is_err()
        {
            break;
        }
    }
    let table = ROUTE_TABLE.to_string();
    let _ = run_ip(netns, &[f, "route", "flush", "table", &table]).await;
    for (hook, chain, _) in chains() {
        for _ in 0..8 {
            let deleted = capture::nsenter(netns)
                .args([
                    family.iptables(),
                    "-w",
                    "-t",
                    "mangle",
                    "-D",
                    hook,
                    "-p",
                    "tcp",
                    "-j",
                ])
                .arg(chain)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .await;
            if !deleted.is_ok_and(|s| s.success()) {
                break;
            }
        }
        for op in ["-F", "-X"] {
            let _ = capture::nsenter(netns)
                .args([family.iptables(), "-w", "-t", "mangle", op, chain])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .await;
        }
    }
}

/// Changes to the namespace's routing rules and routes of both families (rtnetlink's
/// RTNLGRP_IPV4_RULE, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_RULE and RTNLGRP_IPV6_ROUTE): the other
/// half of what [`check`] compares (the chains' changes are nf_tables events,
/// [`RuleChanges::open`]). And its links' (RTNLGRP_LINK): a link set down drops its IPv4
/// routes (table 133's `local ... dev lo` with lo's) without a route event.
pub(crate) async fn route_changes(netns: &Netns) -> std::io::Result<RuleChanges> {
    use nix::libc::{
        RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV4_RULE, RTNLGRP_IPV6_ROUTE, RTNLGRP_IPV6_RULE, RTNLGRP_LINK,
    };
    let groups = [
        RTNLGRP_IPV4_ROUTE,
        RTNLGRP_IPV4_RULE,
        RTNLGRP_IPV6_ROUTE,
        RTNLGRP_IPV6_RULE,
        RTNLGRP_LINK,
    ]
    .iter()
    .fold(0u32, |g, n| g | (1 << (n - 1)));
    RuleChanges::subscribe(netns, SockProtocol::NetlinkRoute, groups).await
}

#[cfg(test)]
#[path = "transparent_tests.rs"]
mod tests;
