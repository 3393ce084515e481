//! Enrolling pods: listeners opened inside a pod's namespace, its certificate fetched, its
//! capture rules installed; and removing them.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_core::model::WorkloadUid;
use ferry_runtime::netns::Netns;
use parking_lot::Mutex;
use tokio::net::TcpListener;

use crate::capture;
use crate::family::Family;
use crate::generation::{self, Generation};
use crate::state::{Node, Pod};
use crate::transparent;

/// How long a pod's ruleset must stay unchanged before its capture rules are compared.
const RULES_SETTLE: Duration = Duration::from_secs(1);

/// How often a pod's capture rules are compared even without a ruleset event.
const RULES_SAFETY_CHECK: Duration = Duration::from_secs(30);

/// How a pod's namespace is named in errors and logs: a descriptor has no path.
const NETNS_LABEL: &str = "(the pod's namespace descriptor)";

/// Why a pod could not be enrolled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EnrollError {
    #[error("no workload {0} in the mesh (is this node's control plane in sync?)")]
    UnknownWorkload(String),
    #[error("workload {uid} runs on node {other}, not on {this}")]
    OtherNode {
        uid: String,
        other: String,
        this: String,
    },
    #[error("workload {0} has no address")]
    NoAddress(String),
    #[error("network namespace {path}: {source}")]
    Netns {
        path: String,
        source: std::io::Error,
    },
    #[error("no certificate for {0}: {1}")]
    Certificate(Identity, String),
    #[error("workload {0} has no valid identity: {1}")]
    BadIdentity(String, String),
    #[error(transparent)]
    Capture(#[from] capture::CaptureError),
}

impl Node {
    /// Enrolls pod `uid` whose network namespace `netns` refers to (held for as long as the pod
    /// is served): waits (up to `wait`) for it to appear in the mesh, gets its certificate,
    /// opens its listeners inside its namespace and installs the capture rules. A pod already
    /// served is served once: it is returned as it is (and `netns` is closed).
    pub(crate) async fn enroll(
        self: &Arc<Self>,
        uid: &str,
        netns: OwnedFd,
        wait: Duration,
    ) -> Result<Arc<Pod>, EnrollError> {
        let uid = WorkloadUid::new(uid);
        // One enrollment of a pod at a time (an add and a release may race).
        let lock = self
            .enrolling
            .lock()
            .entry(uid.clone())
            .or_default()
            .clone();
        let _one = lock.lock().await;
        if let Some(p) = self.pods.lock().get(&uid) {
            return Ok(p.clone());
        }
        // Waits for the workload to appear in the mesh: on each new snapshot, up to `wait`.
        let mut changes = self.changes.clone();
        let appeared = tokio::time::timeout(wait, async {
            loop {
                if let Some(w) = self.store.load().workload(&uid).cloned() {
                    return Some(w);
                }
                if changes.changed().await.is_err() {
                    return None;
                }
            }
        });
        let w = match appeared.await {
            Ok(Some(w)) => w,
            // Looked at once more: `wait` may be zero.
            _ => self
                .store
                .load()
                .workload(&uid)
                .cloned()
                .ok_or_else(|| EnrollError::UnknownWorkload(uid.to_string()))?,
        };
        if w.node.as_ref() != Some(&self.name) {
            return Err(EnrollError::OtherNode {
                uid: uid.to_string(),
                other: w.node.as_ref().map_or("(none)".into(), ToString::to_string),
                this: self.name.to_string(),
            });
        }
        let ip = *w
            .addresses
            .first()
            .ok_or_else(|| EnrollError::NoAddress(uid.to_string()))?;
        let identity = w
            .identity()
            .map_err(|e| EnrollError::BadIdentity(uid.to_string(), e.to_string()))?;
        self.certs
            .fetch(&identity)
            .await
            .map_err(|e| EnrollError::Certificate(identity.clone(), e.to_string()))?;
        let ns = Netns::from_fd(netns).map_err(|source| EnrollError::Netns {
            path: NETNS_LABEL.into(),
            source,
        })?;
        let io = |source| EnrollError::Netns {
            path: NETNS_LABEL.into(),
            source,
        };
        let v6 = ipv6_of(&ns).await;
        // IPv6 is captured wherever ip6tables works (fail closed: a namespace that turns IPv6
        // on later has its connections refused, not let past the proxy), and must be where
        // the namespace has it on.
        let mut captured = vec![Family::V4];
        if v6.enabled || capture::saved(ns.path(), Family::V6).await.is_ok() {
            captured.push(Family::V6);
        }
        // The listeners of each family served: IPv4's always, IPv6's where it is on.
        let mut listeners = vec![listeners(&ns, Family::V4).await.map_err(io)?];
        if v6.enabled {
            listeners.extend(listeners_v6(&ns, &uid).await);
        }
        let serves_v6 = listeners.len() > 1;
        if !v6.enabled {
            tracing::info!(pod = %uid, "IPv6 is disabled in the pod's namespace: served over IPv4 only");
        } else if !v6.loopback {
            tracing::info!(pod = %uid, "no ::1 on the pod's loopback: its outbound IPv6 connections are redirected to a proxy it cannot reach, and fail");
        }
        let mut ips = vec![ip];
        ips.extend(
            w.addresses
                .iter()
                .copied()
                .filter(|a| Family::of(*a) != Family::of(ip))
                .filter(|a| a.is_ipv4() || serves_v6)
                .take(1),
        );
        let pod = Arc::new(Pod {
            uid: uid.clone(),
            name: w.name.clone(),
            ip,
            ips,
            captured,
            serves_v6,
            identity,
            dns: w
                .dns_capture
                .then(|| self.dns.resolver(self.store.clone(), uid.clone())),
            netns: ns,
            tasks: Mutex::new(Vec::new()),
            transparent: std::sync::atomic::AtomicBool::new(false),
            transparent_v6: std::sync::atomic::AtomicBool::new(false),
        });
        // Before the rules, as the listeners: a pod whose queries cannot be served is not.
        let mut dns = Vec::new();
        if pod.dns.is_some() {
            dns.push(crate::dns::bind(&pod.netns, Family::V4).await.map_err(io)?);
            if serves_v6 {
                match crate::dns::bind(&pod.netns, Family::V6).await {
                    Ok(s) => dns.push(s),
                    // No ::1: the pod's IPv6 queries are redirected there and fail (closed).
                    Err(e) => {
                        tracing::info!(pod = %uid, error = %e, "no DNS proxy on [::1]:15053; the pod's IPv6 DNS queries fail")
                    }
                }
            }
        }
        // Registered before the listeners accept: a connection they take may need the pod
        // (the tunnel dialer finds pods by address).
        for a in &pod.ips {
            self.by_ip.lock().insert(*a, pod.clone());
        }
        self.pods.lock().insert(uid.clone(), pod.clone());
        {
            let mut t = pod.tasks.lock();
            for [outbound, inbound, hbone] in listeners {
                t.push(tokio::spawn(self.clone().serve_tcp(
                    pod.clone(),
                    outbound,
                    "outbound",
                    crate::outbound::handle,
                )));
                t.push(tokio::spawn(self.clone().serve_tcp(
                    pod.clone(),
                    inbound,
                    "inbound plain",
                    crate::inbound::plain,
                )));
                t.push(tokio::spawn(crate::inbound::serve_hbone(
                    self.clone(),
                    pod.clone(),
                    hbone,
                )));
            }
            t.push(tokio::spawn(self.clone().keep_rules(pod.clone())));
            if let Some(resolver) = pod.dns.clone() {
                let egress = Arc::new(crate::state::PodEgress(pod.clone()));
                for socket in dns {
                    t.push(tokio::spawn(
                        resolver.clone().serve_udp(egress.clone(), socket),
                    ));
                }
            }
        }
        for family in pod.captured.clone() {
            if let Err(e) = capture::install(
                pod.netns.path(),
                family,
                &self.uncaptured(&uid),
                pod.dns.is_some(),
            )
            .await
            {
                for a in &pod.ips {
                    self.by_ip.lock().remove(a);
                }
                self.pods.lock().remove(&uid);
                self.stop(&pod).await;
                return Err(e.into());
            }
        }
        for family in pod.transparent_families() {
            self.install_transparent(&pod, family).await;
        }
        tracing::info!(pod = %uid, ip = %ip, ips = ?pod.ips, ipv6 = serves_v6, identity = %pod.identity, netns = %pod.netns.path().display(), dns_capture = pod.dns.is_some(), "pod enrolled");
        Ok(pod)
    }

    /// Removes pod `uid`: closes its listeners and deletes its capture rules.
    pub(crate) async fn remove(&self, uid: &str) -> bool {
        // Not while the pod is being enrolled (a restore or retry racing a release).
        let lock = self.enrolling.lock().get(&WorkloadUid::new(uid)).cloned();
        let _one = match &lock {
            Some(l) => Some(l.lock().await),
            None => None,
        };
        self.enrolling.lock().remove(&WorkloadUid::new(uid));
        let pod = self.pods.lock().remove(&WorkloadUid::new(uid));
        match pod {
            Some(p) => {
                for a in &p.ips {
                    self.by_ip.lock().remove(a);
                }
                self.stop(&p).await;
                tracing::info!(pod = %uid, "pod removed");
                true
            }
            None => false,
        }
    }

    /// Keeps `pod`'s capture rules in place for as long as it is served: whenever its
    /// namespace's ruleset changes ([`capture::RuleChanges`]), once the changes have settled
    /// for [`RULES_SETTLE`], its nat table is compared with Ferry's rules and rewritten on a
    /// difference (counted, logged). A lost event is an overrun the socket reports, itself a
    /// change; so nothing runs on a timer while both event sockets are heard and iptables is
    /// iptables-nft (an idle proxy runs no code at all for its pods: any code run maps its
    /// pages back in, measured at 2.4 MB for a generation read every 30 s). Otherwise (legacy
    /// iptables, an event socket lost) every [`RULES_SAFETY_CHECK`]: in full only if the
    /// namespace's nf_tables generation ([`generation`]) moved since the last comparison that
    /// left the rules Ferry's, or cannot be read (a full comparison forks `nsenter` and
    /// `iptables-save`, and `ip`, for each family).
    async fn keep_rules(self: Arc<Self>, pod: Arc<Pod>) {
        let mut changes = match capture::RuleChanges::open(&pod.netns).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(pod = %pod.uid, error = %e, "no ruleset events from the pod's namespace; its capture rules are compared every 30 s only");
                None
            }
        };
        // The original-source rules' routing half changes without an nf_tables event.
        let mut routes = match transparent::route_changes(&pod.netns).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(pod = %pod.uid, error = %e, "no routing events from the pod's namespace; its original-source rules are compared every 30 s only");
                None
            }
        };
        let mut ruleset = RulesetGeneration::open(&pod).await;
        // The generation read before the last comparison that left the rules Ferry's.
        let mut checked = None;
        loop {
            let timer =
                generation::needs_safety_check(ruleset.nft, changes.is_some(), routes.is_some());
            let event = tokio::select! {
                r = settled(changes.as_mut()) => {
                    if let Err(e) = r {
                        tracing::warn!(pod = %pod.uid, error = %e, "ruleset events from the pod's namespace stopped; its capture rules are compared every 30 s only");
                        changes = None;
                    }
                    true
                },
                r = settled(routes.as_mut()) => {
                    if let Err(e) = r {
                        tracing::warn!(pod = %pod.uid, error = %e, "routing events from the pod's namespace stopped; its original-source rules are compared every 30 s only");
                        routes = None;
                    }
                    true
                },
                () = safety_check(timer) => false,
            };
            let now = ruleset.read(&pod).await;
            if !generation::compare_in_full(event, routes.is_some(), checked, now) {
                continue;
            }
            let found_by = if event {
                FoundBy::Event
            } else {
                FoundBy::SafetyCheck
            };
            checked = if self.repair_rules(&pod, found_by).await {
                now
            } else {
                None
            };
        }
    }

    /// Rewrites `pod`'s capture rules if they differ from Ferry's, and its original-source
    /// rules ([`Node::repair_transparent`]); `true` if they are all Ferry's now. `found_by`
    /// (logged) says what led to the comparison.
    async fn repair_rules(&self, pod: &Pod, found_by: FoundBy) -> bool {
        // The held descriptor's `/proc/self/fd` path: it names the pod's namespace for as long
        // as the pod is served.
        let path = pod.netns.path();
        let mut in_place = true;
        for family in pod.transparent_families() {
            in_place &= self.repair_transparent(pod, family).await;
        }
        let uncaptured = self.uncaptured(&pod.uid);
        let dns = pod.dns.is_some();
        for &family in &pod.captured {
            let Some(drift) = capture::check(path, family, &uncaptured, dns).await else {
                continue;
            };
            self.capture_repairs.inc();
            match capture::install(path, family, &uncaptured, dns).await {
                Ok(()) => {
                    tracing::warn!(pod = %pod.uid, family = family.name(), capture.drift = %drift, capture.found_by = found_by.name(), "capture rules were missing or altered; rewritten")
                }
                Err(e) => {
                    in_place = false;
                    tracing::error!(pod = %pod.uid, family = family.name(), capture.drift = %drift, capture.found_by = found_by.name(), error = %e, "capture rules are missing or altered and cannot be rewritten")
                }
            }
        }
        in_place
    }

    async fn stop(&self, pod: &Pod) {
        for t in pod.tasks.lock().drain(..) {
            t.abort();
        }
        for family in pod.transparent_families() {
            pod.transparent(family).store(false, Ordering::Relaxed);
            transparent::remove(pod.netns.path(), family).await;
        }
        for &family in &pod.captured {
            capture::remove(pod.netns.path(), family).await;
        }
    }
}

/// What led to a comparison of a pod's rules with Ferry's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FoundBy {
    /// A ruleset or routing change event from the pod's namespace.
    Event,
    /// The timer of [`RULES_SAFETY_CHECK`] (no events, or legacy iptables).
    SafetyCheck,
}

impl FoundBy {
    fn name(self) -> &'static str {
        match self {
            Self::Event => "event",
            Self::SafetyCheck => "safety_check",
        }
    }
}

/// Resolves after [`RULES_SAFETY_CHECK`] if `due`, never otherwise.
async fn safety_check(due: bool) {
    if due {
        tokio::time::sleep(RULES_SAFETY_CHECK).await
    } else {
        std::future::pending().await
    }
}

/// The nf_tables generation of one pod's namespace, if it tells of its rules' changes (the
/// nf_tables backend of iptables) and can be read; read errors are logged once per pod.
struct RulesetGeneration {
    /// iptables is iptables-nft ([`generation::nft_backend`]).
    nft: bool,
    socket: Option<Generation>,
    warned: bool,
}

impl RulesetGeneration {
    async fn open(pod: &Pod) -> Self {
        let nft = generation::nft_backend().await;
        let socket = if nft {
            match Generation::open(&pod.netns).await {
                Ok(g) => Some(g),
                Err(e) => {
                    tracing::warn!(pod = %pod.uid, error = %e, "the pod's nf_tables generation cannot be read: its rules are read in full every 30 s");
                    None
                }
            }
        } else {
            None
        };
        Self {
            nft,
            socket,
            warned: false,
        }
    }

    async fn read(&mut self, pod: &Pod) -> Option<u32> {
        match self.socket.as_ref()?.read(&pod.netns).await {
            Ok(g) => Some(g),
            Err(e) => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(pod = %pod.uid, error = %e, "the pod's nf_tables generation cannot be read: its rules are read in full every 30 s until it can");
                }
                None
            }
        }
    }
}

/// Resolves once `changes` announced a change and then stayed quiet for [`RULES_SETTLE`]
/// (another program's change may come in several steps: compared once they stop); never
/// without `changes`.
async fn settled(changes: Option<&mut capture::RuleChanges>) -> std::io::Result<()> {
    let Some(c) = changes else {
        return std::future::pending().await;
    };
    c.next().await?;
    while let Ok(more) = tokio::time::timeout(RULES_SETTLE, c.next()).await {
        more?;
    }
    Ok(())
}

impl Node {
    /// Installs `pod`'s original-source rules of `family` ([`transparent`]); the app sees the
    /// client's address from then on. A failure only costs that: logged, and the pod is served.
    async fn install_transparent(&self, pod: &Pod, family: Family) {
        match transparent::install(pod.netns.path(), family).await {
            Ok(()) => pod.transparent(family).store(true, Ordering::Relaxed),
            Err(e) => {
                pod.transparent(family).store(false, Ordering::Relaxed);
                tracing::error!(pod = %pod.uid, family = family.name(), error = %e, "original-source rules cannot be installed; the app sees the pod's own address as every mesh connection's source");
            }
        }
    }

    /// Rewrites `pod`'s original-source rules if they differ from Ferry's (counted with the
    /// capture's repairs); `true` if they are Ferry's now. Until they are back, connections to
    /// the app come from the pod's own address.
    async fn repair_transparent(&self, pod: &Pod, family: Family) -> bool {
        let Some(drift) = transparent::check(pod.netns.path(), family).await else {
            return true;
        };
        pod.transparent(family).store(false, Ordering::Relaxed);
        self.capture_repairs.inc();
        tracing::warn!(pod = %pod.uid, family = family.name(), transparent.drift = %drift, "original-source rules were missing or altered; rewriting");
        self.install_transparent(pod, family).await;
        pod.transparent(family).load(Ordering::Relaxed)
    }
}

/// What a pod's namespace allows of IPv6, read inside it.
#[derive(Clone, Copy, Debug)]
struct Ipv6 {
    /// `net.ipv6.conf.all.disable_ipv6` is 0 (and the kernel has IPv6).
    enabled: bool,
    /// `::1` is on its loopback (where its outbound IPv6 connections are redirected).
    loopback: bool,
}

async fn ipv6_of(netns: &Netns) -> Ipv6 {
    let read = netns
        .run(|| {
            // /proc/sys/net is the namespace of the thread that opens it: this one's.
            let enabled = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
                .is_ok_and(|v| v.trim() == "0");
            let loopback = std::net::UdpSocket::bind((std::net::Ipv6Addr::LOCALHOST, 0)).is_ok();
            Ipv6 { enabled, loopback }
        })
        .await;
    read.unwrap_or(Ipv6 {
        enabled: false,
        loopback: false,
    })
}

/// The outbound, inbound and HBONE listeners of `family` in the pod's namespace (`0.0.0.0` or
/// `[::]`, one family each).
async fn listeners(netns: &Netns, family: Family) -> std::io::Result<[TcpListener; 3]> {
    let at = |port| SocketAddr::new(family.unspecified(), port);
    Ok([
        netns.listen_one_family(at(capture::OUTBOUND_PORT)).await?,
        netns.listen_one_family(at(capture::INBOUND_PORT)).await?,
        netns.listen_one_family(at(capture::HBONE_PORT)).await?,
    ])
}

/// IPv6's listeners, if they can be opened: a pod whose IPv6 cannot be served is served over
/// IPv4 (its IPv6 connections, captured, are refused), never refused itself.
async fn listeners_v6(netns: &Netns, uid: &WorkloadUid) -> Option<[TcpListener; 3]> {
    match listeners(netns, Family::V6).await {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::info!(pod = %uid, error = %e, "no IPv6 listeners in the pod's namespace: served over IPv4 only");
            None
        }
    }
}
