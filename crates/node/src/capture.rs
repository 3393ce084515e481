//! Capture rules inside a pod's network namespace (iptables, nat table), for each IP family
//! ([`Family`]): the same rules with `iptables` for IPv4 and `ip6tables` for IPv6, loopback
//! being 127.0.0.0/8 and ::1/128.
//!
//! ```text
//!   OUTPUT     -p tcp -> FERRY_OUT:  marked by the proxy -> RETURN
//!                                     to loopback         -> RETURN
//!                                     anything else       -> REDIRECT :15001 (outbound)
//!   PREROUTING -p tcp -> FERRY_IN:   to :15008 (HBONE)   -> RETURN (served directly)
//!                                     to an uncaptured port -> RETURN (only if enrolled so)
//!                                     anything else       -> REDIRECT :15006 (inbound plain)
//! ```
//! A pod whose workload says `dns_capture` also has its DNS queries captured ([`dns_chain`]):
//!
//! ```text
//!   OUTPUT     -p udp -> FERRY_DNS:  marked by the proxy -> RETURN
//!                                     to loopback         -> RETURN
//!                                     to :53              -> REDIRECT :15053 (the DNS proxy)
//! ```
//! Its jump is OUTPUT's second rule, right after FERRY_OUT's. DNS over TCP needs no rule of its
//! own: FERRY_OUT takes it to the outbound listener with the rest of the pod's TCP, and the
//! outbound side hands a connection to port 53 to the DNS proxy (`crate::dns`).
//!
//! Rules live in their own chains so removal is exact and leaves the pod's own rules alone.
//!
//! A pod may be enrolled with inbound ports left out of capture ([`Uncaptured`], ZDS's
//! `ferry_uncaptured_ports`): `ferry lab bench` uses one for its direct baseline. Only the
//! enroller sets it (on the node agent's root-only socket, the same privilege that could leave
//! the pod out of the mesh altogether); nothing a pod carries (labels, annotations, packet
//! marks) can. The rules of such a pod are those with the exemption, and
//! drift is judged against them.
//!
//! Enrolling a pod (also on a node proxy's start, for every pod it restores) compares the pod's
//! whole nat table with Ferry's rules and, on any difference, rewrites both chains whole and
//! puts each jump first, in one `iptables-restore` transaction. While the pod is served, the
//! node proxy compares the pod's whole nat table against that again ([`drift`]: chain contents,
//! one jump per hook, first) whenever the namespace's ruleset changes, and rewrites it on any
//! difference. The change is an event: iptables-nft (and nft) rule changes are nf_tables
//! transactions, which the kernel multicasts to the namespace's NFNLGRP_NFTABLES netlink group
//! ([`RuleChanges`]); a lost event is an overrun the socket reports, a change too. Where no
//! events are heard (legacy iptables, a socket lost) a safety comparison runs every 30 s; it
//! first asks the namespace's nf_tables ruleset generation ([`crate::generation`], one netlink
//! request) and reads the rules only if that moved since the last comparison that left them
//! Ferry's ([`crate::pods`]).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::process::Command;

use ferry_runtime::netns::{MARK, Netns};

pub(crate) use crate::family::Family;
pub(crate) use ferry_core::ports::{HBONE_PORT, INBOUND_PORT, OUTBOUND_PORT};

/// Why rules could not be changed.
#[derive(Debug, thiserror::Error)]
#[error("{tool} in {netns}: {detail}")]
pub(crate) struct CaptureError {
    /// `iptables` or `ip6tables`.
    pub tool: &'static str,
    pub netns: String,
    pub detail: String,
}

/// Inbound ports of one pod that its capture rules leave alone (set at enrollment only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Uncaptured {
    /// Sorted, without duplicates.
    ports: Vec<u16>,
}

// === impl Uncaptured ===

impl Uncaptured {
    pub(crate) fn new(mut ports: Vec<u16>) -> Self {
        ports.sort_unstable();
        ports.dedup();
        Self { ports }
    }

    /// `uncaptured=<port>,<port>...` (as the state file writes it). A proxy
    /// port or port 0 is refused: leaving those out of capture would break the pod's serving.
    pub(crate) fn parse(word: &str) -> Option<Self> {
        let ports = word
            .strip_prefix("uncaptured=")?
            .split(',')
            .map(|p| p.parse::<u32>().ok().and_then(uncapturable))
            .collect::<Option<Vec<u16>>>()?;
        Some(Self::new(ports))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }
}

impl std::fmt::Display for Uncaptured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<String> = self.ports.iter().map(ToString::to_string).collect();
        write!(f, "uncaptured={}", ports.join(","))
    }
}

const PROXY_PORTS: [u16; 3] = [OUTBOUND_PORT, INBOUND_PORT, HBONE_PORT];

/// `port` as a port a pod may be enrolled to leave out of capture: not 0, not a proxy port
/// (leaving those out would break the pod's serving), and a port at all.
pub(crate) fn uncapturable(port: u32) -> Option<u16> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p != 0 && !PROXY_PORTS.contains(p))
}

/// Ferry's chain of each hook, with the rules it holds, as `iptables-save` (or
/// `ip6tables-save`) prints them.
fn chains(
    family: Family,
    uncaptured: &Uncaptured,
) -> [(&'static str, &'static str, Vec<String>); 2] {
    let mut inbound = vec![format!("-p tcp -m tcp --dport {HBONE_PORT} -j RETURN")];
    inbound.extend(
        uncaptured
            .ports
            .iter()
            .map(|p| format!("-p tcp -m tcp --dport {p} -j RETURN")),
    );
    inbound.push(format!("-p tcp -j REDIRECT --to-ports {INBOUND_PORT}"));
    [
        (
            "OUTPUT",
            "FERRY_OUT",
            vec![
                format!("-m mark --mark {MARK:#x}/0xfff -j RETURN"),
                format!("-d {} -j RETURN", family.loopback()),
                format!("-p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}"),
            ],
        ),
        ("PREROUTING", "FERRY_IN", inbound),
    ]
}

/// The rules of `chain` in `saved` (the nat table as `iptables-save` prints it), in order.
fn rules_of<'a>(saved: &'a str, chain: &str) -> Vec<&'a str> {
    let prefix = format!("-A {chain} ");
    saved
        .lines()
        .filter_map(|l| l.trim_end().strip_prefix(prefix.as_str()))
        .collect()
}

fn jump(chain: &str) -> String {
    format!("-p tcp -j {chain}")
}

/// The chain of a DNS-captured pod's UDP queries.
const DNS_CHAIN: &str = "FERRY_DNS";

/// OUTPUT's jump to [`DNS_CHAIN`].
fn dns_jump() -> String {
    format!("-p udp -j {DNS_CHAIN}")
}

/// The rules of [`DNS_CHAIN`] for a pod whose DNS is captured (`None`: not captured, no chain).
fn dns_chain(family: Family, dns: bool) -> Option<Vec<String>> {
    dns.then(|| {
        vec![
            format!("-m mark --mark {MARK:#x}/0xfff -j RETURN"),
            format!("-d {} -j RETURN", family.loopback()),
            format!(
                "-p udp -m udp --dport 53 -j REDIRECT --to-ports {}",
                crate::dns::DNS_PORT
            ),
        ]
    })
}

/// How the DNS capture rules in `saved` differ from what the pod was enrolled with: with `dns`,
/// [`DNS_CHAIN`] holds exactly its rules and OUTPUT jumps to it once, as its second rule (after
/// FERRY_OUT's jump: a rule of the pod's before it could take queries past the proxy); without,
/// nothing jumps to it.
pub(crate) fn dns_drift(saved: &str, family: Family, dns: bool) -> Option<String> {
    let hook = rules_of(saved, "OUTPUT");
    let jumps = hook.iter().filter(|r| **r == dns_jump()).count();
    let Some(want) = dns_chain(family, dns) else {
        return (jumps > 0)
            .then(|| format!("OUTPUT jumps to {DNS_CHAIN} {jumps} time(s), 0 wanted"));
    };
    let mut found = Vec::new();
    let have = rules_of(saved, DNS_CHAIN);
    if have != want {
        found.push(format!(
            "{DNS_CHAIN} holds {} rule(s) that differ from Ferry's {}",
            have.len(),
            want.len()
        ));
    }
    let second = hook.get(1) == Some(&dns_jump().as_str());
    if jumps != 1 || !second {
        found.push(format!(
            "OUTPUT jumps to {DNS_CHAIN} {jumps} time(s), {}",
            if second { "second" } else { "not second" }
        ));
    }
    (!found.is_empty()).then(|| found.join("; "))
}

/// The lines of the `iptables-restore` transaction ([`rewrite`]) that make the DNS capture
/// rules what `dns` says, whatever `saved` holds: run after FERRY_OUT's jump was put first.
fn dns_rewrite(saved: &str, family: Family, dns: bool) -> String {
    let mut script = String::new();
    let jumps = rules_of(saved, "OUTPUT")
        .into_iter()
        .filter(|r| *r == dns_jump())
        .count();
    for _ in 0..jumps {
        script.push_str(&format!("-D OUTPUT {}\n", dns_jump()));
    }
    let exists = saved
        .lines()
        .any(|l| l.starts_with(&format!(":{DNS_CHAIN} ")));
    match dns_chain(family, dns) {
        Some(rules) => {
            script.push_str(&format!(":{DNS_CHAIN} - [0:0]\n"));
            for rule in rules {
                script.push_str(&format!("-A {DNS_CHAIN} {rule}\n"));
            }
            script.push_str(&format!("-I OUTPUT 2 {}\n", dns_jump()));
        }
        None if exists => {
            script.push_str(&format!("-F {DNS_CHAIN}\n-X {DNS_CHAIN}\n"));
        }
        None => {}
    }
    script
}

/// How the capture rules in `saved` differ from Ferry's, if they do: each of Ferry's chains
/// must hold exactly its rules, and each hook must jump to it once, as its first rule (a rule
/// of the pod's before it could take traffic past the proxy). `uncaptured` is what the pod was
/// enrolled with.
pub(crate) fn drift(saved: &str, family: Family, uncaptured: &Uncaptured) -> Option<String> {
    drift_of(saved, &chains(family, uncaptured))
}

/// How the chains of `saved` (one table as `iptables-save` prints it) differ from `chains`
/// (hook, chain, rules), if they do: each chain holds exactly its rules, and its hook jumps to
/// it once, first.
pub(crate) fn drift_of(saved: &str, chains: &[(&str, &str, Vec<String>)]) -> Option<String> {
    let mut found = Vec::new();
    for &(hook, chain, ref want) in chains {
        let have = rules_of(saved, chain);
        if have != *want {
            found.push(format!(
                "{chain} holds {} rule(s) that differ from Ferry's {}",
                have.len(),
                want.len()
            ));
        }
        let hook_rules = rules_of(saved, hook);
        let jumps = hook_rules.iter().filter(|r| **r == jump(chain)).count();
        if jumps != 1 || hook_rules.first() != Some(&jump(chain).as_str()) {
            found.push(format!(
                "{hook} jumps to {chain} {jumps} time(s), {}",
                if hook_rules.first() == Some(&jump(chain).as_str()) {
                    "first"
                } else {
                    "not first"
                }
            ));
        }
    }
    (!found.is_empty()).then(|| found.join("; "))
}

/// One `iptables-restore --noflush` transaction that makes the rules Ferry's, whatever `saved`
/// holds now: declaring a chain empties it, every jump to it is deleted and one is put first.
/// Applied at once, so traffic never sees a state in between (a handover from a previous node
/// proxy leaves no window).
fn rewrite(saved: &str, family: Family, uncaptured: &Uncaptured) -> String {
    rewrite_of("nat", saved, &chains(family, uncaptured))
}

/// [`rewrite`] for `chains` (hook, chain, rules) of `table`.
pub(crate) fn rewrite_of(table: &str, saved: &str, chains: &[(&str, &str, Vec<String>)]) -> String {
    let mut script = format!("*{table}\n");
    for (_, chain, _) in chains {
        script.push_str(&format!(":{chain} - [0:0]\n"));
    }
    for &(hook, chain, ref want) in chains {
        for rule in want {
            script.push_str(&format!("-A {chain} {rule}\n"));
        }
        let jumps = rules_of(saved, hook)
            .into_iter()
            .filter(|r| *r == jump(chain))
            .count();
        for _ in 0..jumps {
            script.push_str(&format!("-D {hook} {}\n", jump(chain)));
        }
        script.push_str(&format!("-I {hook} 1 {}\n", jump(chain)));
    }
    script.push_str("COMMIT\n");
    script
}

pub(crate) fn nsenter(netns: &Path) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={}", netns.display()));
    c
}

/// The pod's nat table of `family` as `iptables-save` (`ip6tables-save`) prints it.
pub(crate) async fn saved(netns: &Path, family: Family) -> Result<String, CaptureError> {
    saved_table(netns, family, "nat").await
}

/// One table of the pod's as `iptables-save` (`ip6tables-save`) prints it.
pub(crate) async fn saved_table(
    netns: &Path,
    family: Family,
    table: &str,
) -> Result<String, CaptureError> {
    let err = |detail: String| CaptureError {
        tool: family.iptables(),
        netns: netns.display().to_string(),
        detail,
    };
    let out = nsenter(netns)
        .args([family.iptables_save(), "-t", table])
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .map_err(|e| {
            err(format!(
                "cannot run nsenter/{}: {e}",
                family.iptables_save()
            ))
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }
}

/// Makes the capture rules Ferry's, whatever is in place: unless the whole nat table already
/// matches them exactly ([`drift`]: then a rewrite would change nothing, and a handover leaves
/// the live rules of the previous node proxy untouched), Ferry's chains are rewritten whole and
/// the jumps put first, in one transaction (see [`rewrite`]).
pub(crate) async fn install(
    netns: &Path,
    family: Family,
    uncaptured: &Uncaptured,
    dns: bool,
) -> Result<(), CaptureError> {
    // Queued connections of a closing listener move to the other listeners of its port group
    // (the next node proxy's) instead of being reset. (One setting for both families.)
    if family == Family::V4 {
        let _ = nsenter(netns)
            .args(["sysctl", "-q", "-w", "net.ipv4.tcp_migrate_req=1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await;
    }
    let saved = saved(netns, family).await?;
    if drift(&saved, family, uncaptured).is_none() && dns_drift(&saved, family, dns).is_none() {
        return Ok(());
    }
    let mut script = rewrite(&saved, family, uncaptured);
    // The DNS rules in the same transaction, before its COMMIT.
    script.truncate(script.len() - "COMMIT\n".len());
    script.push_str(&dns_rewrite(&saved, family, dns));
    script.push_str("COMMIT\n");
    restore(netns, family, &script).await
}

/// Applies `script` in one `iptables-restore --noflush` (`ip6tables-restore`) transaction.
pub(crate) async fn restore(
    netns: &Path,
    family: Family,
    script: &str,
) -> Result<(), CaptureError> {
    let err = |detail: String| CaptureError {
        tool: family.iptables(),
        netns: netns.display().to_string(),
        detail,
    };
    let mut child = nsenter(netns)
        .args([family.iptables_restore(), "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| {
            err(format!(
                "cannot run nsenter/{}: {e}",
                family.iptables_restore()
            ))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .await
            .map_err(|e| err(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| err(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }
}

/// Removes the capture rules of `family`; missing rules are not an error.
pub(crate) async fn remove(netns: &Path, family: Family) {
    let ipt = |args: &[&str]| {
        let mut c = nsenter(netns);
        c.arg(family.iptables())
            .args(["-w", "-t", "nat"])
            .args(args);
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c
    };
    for (chain, hook) in [("FERRY_OUT", "OUTPUT"), ("FERRY_IN", "PREROUTING")] {
        // Delete every jump (a crashed earlier run may have left several).
        for _ in 0..8 {
            match ipt(&["-D", hook, "-p", "tcp", "-j", chain]).status().await {
                Ok(s) if s.success() => {}
                _ => break,
            }
        }
        let _ = ipt(&["-F", chain]).status().await;
        let _ = ipt(&["-X", chain]).status().await;
    }
    for _ in 0..8 {
        match ipt(&["-D", "OUTPUT", "-p", "udp", "-j", DNS_CHAIN])
            .status()
            .await
        {
            Ok(s) if s.success() => {}
            _ => break,
        }
    }
    let _ = ipt(&["-F", DNS_CHAIN]).status().await;
    let _ = ipt(&["-X", DNS_CHAIN]).status().await;
}

/// How the pod's capture rules differ from Ferry's, if they do (see [`drift`]); rules that
/// cannot be read count as differing.
pub(crate) async fn check(
    netns: &Path,
    family: Family,
    uncaptured: &Uncaptured,
    dns: bool,
) -> Option<String> {
    match saved(netns, family).await {
        Ok(saved) => match (
            drift(&saved, family, uncaptured),
            dns_drift(&saved, family, dns),
        ) {
            (None, None) => None,
            (a, b) => Some(a.into_iter().chain(b).collect::<Vec<_>>().join("; ")),
        },
        Err(e) => Some(e.to_string()),
    }
}

/// Changes to the nf_tables ruleset of one network namespace: a NETLINK_NETFILTER socket opened
/// inside it and joined to the NFNLGRP_NFTABLES multicast group, where the kernel announces
/// every committed ruleset change (tables, chains, rules). The messages are not parsed: any of
/// them is a reason to compare the rules again.
#[derive(Debug)]
pub(crate) struct RuleChanges {
    socket: AsyncFd<OwnedFd>,
}

// === impl RuleChanges ===

impl RuleChanges {
    /// Subscribes inside `netns` (a netlink socket belongs to the namespace it is created in).
    pub(crate) async fn open(netns: &Netns) -> io::Result<Self> {
        let group = 1 << (nix::libc::NFNLGRP_NFTABLES - 1);
        Self::subscribe(netns, SockProtocol::NetlinkNetFilter, group).await
    }

    /// Messages of the netlink `groups` (a bit mask) of `protocol` inside `netns`: any of them
    /// is a change (see [`RuleChanges::next`]).
    pub(crate) async fn subscribe(
        netns: &Netns,
        protocol: SockProtocol,
        groups: u32,
    ) -> io::Result<Self> {
        let fd = netns
            .run(move || -> nix::Result<OwnedFd> {
                let fd = socket(
                    AddressFamily::Netlink,
                    SockType::Raw,
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                    protocol,
                )?;
                bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
                Ok(fd)
            })
            .await??;
        // SAFETY: an `OwnedFd` is a valid, open descriptor, and it stays open and the same for
        // as long as the `AsyncFd` owns it (tokio's safe constructor is deprecated for lack of
        // that guarantee from arbitrary `AsRawFd` types).
        #[allow(unsafe_code)]
        let socket = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(Self { socket })
    }

    /// Resolves at the next change, once every message queued so far has been read (a burst
    /// of them counts once). A queue that overflowed lost some: that is a change too.
    pub(crate) async fn next(&mut self) -> io::Result<()> {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let mut ready = self.socket.readable().await?;
            let mut changed = false;
            loop {
                match recv(
                    ready.get_inner().as_raw_fd(),
                    &mut buf,
                    MsgFlags::MSG_DONTWAIT,
                ) {
                    Ok(_) | Err(Errno::ENOBUFS) => changed = true,
                    Err(Errno::EAGAIN) => {
                        ready.clear_ready();
                        break;
                    }
                    Err(Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if changed {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "capture_dns_tests.rs"]
mod dns_tests;
