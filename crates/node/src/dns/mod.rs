//! The DNS proxy: a DNS-captured pod's queries, answered for mesh names, forwarded otherwise.
//!
//! A pod whose workload says `dns_capture` (the topology's field; Istio's pod annotation
//! `ambient.istio.io/dns-capture: "true"` from Kubernetes) has its UDP queries to port 53
//! redirected to [`DNS_PORT`] on the pod's loopback (`crate::capture`: chain FERRY_DNS), where
//! a socket of the node proxy's, opened inside the pod's namespace, takes them; its TCP
//! queries reach the outbound listener with the rest of its TCP, which hands a connection to
//! port 53 to [`Resolver::serve_tcp`]. Each query is decided by [`answer::decide`] on the
//! current snapshot for the pod's own workload (`ferry_core::dns`: scope applied): a mesh
//! name is answered at once; anything else is sent, as the bytes the pod sent, to the node's
//! upstream resolver (`--dns-upstream`, default the node's `/etc/resolv.conf`) from inside the
//! pod's namespace with the proxy's mark, and the upstream's answer goes back as the bytes it
//! sent: a truncated answer (TC) goes back truncated, and the stub's TCP retry is forwarded over
//! TCP. An upstream that cannot be reached is answered SERVFAIL.
//!
//! Fail closed: the socket is opened before the rules are installed, and a pod whose socket
//! cannot be opened is not served (its enrollment fails, as for the TCP listeners): with the
//! rules of an earlier node proxy in place its queries meet a closed port, never the network.
//!
//! Counted in `ferry_dns_queries_total{outcome="answered"|"forwarded"|"failed",
//! protocol="udp"|"tcp"}`.

mod answer;
mod serve;

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use crate::family::Family as IpFamily;
use ferry_core::model::WorkloadUid;
use ferry_core::store::Store;
use ferry_runtime::netns::Netns;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpStream, UdpSocket};

pub(crate) use answer::Transport;
pub(crate) use serve::is_dns;

/// Where a pod's redirected UDP queries arrive, on its loopback (Istio's DNS proxy port).
pub(crate) const DNS_PORT: u16 = 15053;

/// The port a DNS query goes to.
pub(crate) const DOMAIN_PORT: u16 = 53;

/// How a query ended, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The proxy answered it (a mesh name).
    Answered,
    /// The upstream answered it.
    Forwarded,
    /// The upstream could not be reached (answered SERVFAIL).
    Failed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Forwarded => "forwarded",
            Self::Failed => "failed",
        }
    }
}

type Labels = [(&'static str, &'static str); 2];

/// `ferry_dns_queries_total`, by outcome and protocol.
#[derive(Clone, Debug, Default)]
pub(crate) struct Metrics(Family<Labels, Counter>);

impl Metrics {
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "ferry_dns_queries",
            "DNS queries of DNS-captured pods, by outcome (answered by the proxy, forwarded upstream, failed) and protocol",
            m.0.clone(),
        );
        m
    }

    fn count(&self, outcome: Outcome, transport: Transport) {
        let protocol = match transport {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        };
        self.0
            .get_or_create(&[("outcome", outcome.as_str()), ("protocol", protocol)])
            .inc();
    }
}

/// The node's DNS settings, shared by every DNS-captured pod.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// Where queries for other names go (`None`: no upstream known; they fail).
    pub(crate) upstream: Option<SocketAddr>,
    pub(crate) metrics: Metrics,
}

impl Settings {
    /// The resolver of one DNS-captured pod.
    pub(crate) fn resolver(&self, store: Arc<Store>, source: WorkloadUid) -> Arc<Resolver> {
        Arc::new(Resolver {
            source,
            store,
            upstream: self.upstream,
            metrics: self.metrics.clone(),
        })
    }
}

/// The first nameserver of the resolv.conf at `path` (port 53), if it names one.
pub(crate) fn upstream_from(path: &std::path::Path) -> Option<SocketAddr> {
    let text = std::fs::read(path).ok()?;
    let conf = resolv_conf::Config::parse(&text).ok()?;
    let ip: IpAddr = conf.nameservers.first()?.into();
    Some(SocketAddr::new(ip, DOMAIN_PORT))
}

/// The DNS proxy of one pod: decides its queries for its own workload, forwards the others.
#[derive(Debug)]
pub(crate) struct Resolver {
    pub(crate) source: WorkloadUid,
    store: Arc<Store>,
    upstream: Option<SocketAddr>,
    metrics: Metrics,
}

/// A boxed future, as [`Egress`] returns them.
pub(crate) type Opening<'a, T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send + 'a>>;

/// Where forwarded queries leave from: the pod's namespace (`crate::state::PodEgress`), or, in
/// tests,
/// this process's own.
pub(crate) trait Egress: Send + Sync + fmt::Debug {
    /// A UDP socket connected to `upstream`.
    fn udp(&self, upstream: SocketAddr) -> Opening<'_, UdpSocket>;
    /// A TCP connection to `upstream`.
    fn tcp(&self, upstream: SocketAddr) -> Opening<'_, TcpStream>;
}

/// The socket a pod's redirected queries of `family` arrive on: `127.0.0.1:`[`DNS_PORT`] or
/// `[::1]:`[`DNS_PORT`] inside its namespace (loopback only: nothing from outside the pod
/// reaches it). Shared by port with the next node proxy during a handover, as the TCP
/// listeners are.
pub(crate) async fn bind(netns: &Netns, family: IpFamily) -> io::Result<UdpSocket> {
    let ip = match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpFamily::V6 => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
    };
    let addr = SocketAddr::new(ip, DNS_PORT);
    let s = netns
        .run(move || -> io::Result<std::net::UdpSocket> {
            let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
            if addr.is_ipv6() {
                s.set_only_v6(true)?;
            }
            s.set_reuse_address(true)?;
            s.set_reuse_port(true)?;
            s.set_nonblocking(true)?;
            s.bind(&addr.into())?;
            Ok(s.into())
        })
        .await??;
    UdpSocket::from_std(s)
}

#[cfg(test)]
#[path = "corpus_tests.rs"]
mod corpus_tests;
