//! The DNS proxy's I/O: a pod's UDP socket and its TCP connections to port 53, and the
//! upstream they forward to.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::answer::{self, Decision, Transport};
use super::{Egress, Outcome, Resolver};

/// How long the upstream has to answer one query.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a pod's TCP connection may stay without a query before it is closed.
const TCP_IDLE: Duration = Duration::from_secs(30);

/// Queries of one pod over UDP in flight at once; more are dropped (a stub asks again).
const UDP_IN_FLIGHT: usize = 256;

/// The largest DNS message (over UDP, and a TCP message's two-byte length).
const MAX_MESSAGE: usize = 65_535;

/// Why a query could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error("no upstream resolver is configured (--dns-upstream)")]
    NoUpstream,
    #[error("upstream {upstream}: {source}")]
    Io {
        upstream: SocketAddr,
        source: io::Error,
    },
    #[error("upstream {upstream} did not answer within {UPSTREAM_TIMEOUT:?}")]
    Timeout { upstream: SocketAddr },
}

impl Resolver {
    /// The proxy's own answer to `query`, if it is for a mesh name; counted.
    fn answer_locally(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let snap = self.store.load();
        // A pod whose workload left the mesh: its queries go upstream.
        let source = snap.workload(&self.source)?;
        match answer::decide(query, &snap, source, transport) {
            Decision::Answer { bytes, hidden } => {
                self.metrics.count(Outcome::Answered, transport);
                tracing::debug!(pod = %self.source, dns.hidden = hidden, dns.protocol = ?transport, "DNS query answered for a mesh name");
                Some(bytes)
            }
            Decision::Forward => None,
        }
    }

    /// What goes back for a query the upstream answered (`Ok`: its bytes) or could not
    /// (SERVFAIL, if the query can be read); counted and logged.
    fn forwarded(
        &self,
        query: &[u8],
        transport: Transport,
        result: Result<Vec<u8>, ForwardError>,
    ) -> Option<Vec<u8>> {
        match result {
            Ok(bytes) => {
                self.metrics.count(Outcome::Forwarded, transport);
                Some(bytes)
            }
            Err(e) => {
                self.metrics.count(Outcome::Failed, transport);
                tracing::warn!(pod = %self.source, dns.protocol = ?transport, error = %e, "DNS query not forwarded; answered SERVFAIL");
                answer::servfail(query)
            }
        }
    }

    fn upstream(&self) -> Result<SocketAddr, ForwardError> {
        self.upstream.ok_or(ForwardError::NoUpstream)
    }

    /// Serves the pod's redirected UDP queries on `socket` until the task is stopped; each on
    /// its own task, at most [`UDP_IN_FLIGHT`] at once.
    pub(crate) async fn serve_udp(self: Arc<Self>, egress: Arc<dyn Egress>, socket: UdpSocket) {
        let socket = Arc::new(socket);
        let in_flight = Arc::new(Semaphore::new(UDP_IN_FLIGHT));
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let (n, peer) = match socket.recv_from(&mut buf).await {
                Ok(r) => r,
                // An ICMP error of an earlier answer; the socket stays usable.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    // Its queries then meet a closed port (fail closed), as with no proxy.
                    tracing::error!(pod = %self.source, error = %e, "the pod's DNS socket failed; its queries are refused");
                    return;
                }
            };
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                tracing::debug!(pod = %self.source, "too many DNS queries in flight; one dropped");
                continue;
            };
            let query = buf[..n].to_vec();
            let (this, egress, socket) = (self.clone(), egress.clone(), socket.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let reply = match this.answer_locally(&query, Transport::Udp) {
                    Some(a) => Some(a),
                    None => {
                        let r = this.forward_udp(&*egress, &query).await;
                        this.forwarded(&query, Transport::Udp, r)
                    }
                };
                if let Some(reply) = reply
                    && let Err(e) = socket.send_to(&reply, peer).await
                {
                    tracing::debug!(pod = %this.source, error = %e, "DNS answer not sent");
                }
            });
        }
    }

    /// One query over UDP to the upstream, from a socket of its own (a fresh source port per
    /// query); the first datagram from the upstream with the query's id is its answer.
    async fn forward_udp(
        &self,
        egress: &dyn Egress,
        query: &[u8],
    ) -> Result<Vec<u8>, ForwardError> {
        let upstream = self.upstream()?;
        let io = |source| ForwardError::Io { upstream, source };
        let exchange = async {
            let socket = egress.udp(upstream).await.map_err(io)?;
            socket.send(query).await.map_err(io)?;
            let mut buf = vec![0u8; MAX_MESSAGE];
            loop {
                let n = socket.recv(&mut buf).await.map_err(io)?;
                if n >= 2 && query.len() >= 2 && buf[..2] == query[..2] {
                    buf.truncate(n);
                    return Ok(buf);
                }
            }
        };
        tokio::time::timeout(UPSTREAM_TIMEOUT, exchange)
            .await
            .map_err(|_| ForwardError::Timeout { upstream })?
    }

    /// Serves one TCP connection of the pod to port 53: length-prefixed queries one after
    /// another, each answered before the next is read; those forwarded share one upstream
    /// connection, opened at the first. Ends when the pod closes, after [`TCP_IDLE`] without a
    /// query, or on an error.
    pub(crate) async fn serve_tcp(self: Arc<Self>, egress: Arc<dyn Egress>, mut tcp: TcpStream) {
        let mut upstream: Option<TcpStream> = None;
        loop {
            let query = match tokio::time::timeout(TCP_IDLE, read_message(&mut tcp)).await {
                Ok(Ok(Some(q))) => q,
                Ok(Ok(None)) | Err(_) => return,
                Ok(Err(e)) => {
                    tracing::debug!(pod = %self.source, error = %e, "DNS over TCP: the pod's connection failed");
                    return;
                }
            };
            let reply = match self.answer_locally(&query, Transport::Tcp) {
                Some(a) => Some(a),
                None => {
                    let r = self.forward_tcp(&*egress, &mut upstream, &query).await;
                    if r.is_err() {
                        upstream = None;
                    }
                    self.forwarded(&query, Transport::Tcp, r)
                }
            };
            let Some(reply) = reply else { return };
            if write_message(&mut tcp, &reply).await.is_err() {
                return;
            }
        }
    }

    async fn forward_tcp(
        &self,
        egress: &dyn Egress,
        conn: &mut Option<TcpStream>,
        query: &[u8],
    ) -> Result<Vec<u8>, ForwardError> {
        let upstream = self.upstream()?;
        let io = |source| ForwardError::Io { upstream, source };
        let exchange = async {
            let c = match conn.take() {
                Some(c) => c,
                None => egress.tcp(upstream).await.map_err(io)?,
            };
            let c = conn.insert(c);
            write_message(c, query).await.map_err(io)?;
            read_message(c).await.map_err(io)?.ok_or_else(|| {
                io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed before answering",
                ))
            })
        };
        tokio::time::timeout(UPSTREAM_TIMEOUT, exchange)
            .await
            .map_err(|_| ForwardError::Timeout { upstream })?
    }
}

/// One length-prefixed DNS message (RFC 1035 4.2.2); `None` at a clean end before its length.
async fn read_message(tcp: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match tcp.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    tcp.read_exact(&mut msg).await?;
    Ok(Some(msg))
}

async fn write_message(tcp: &mut TcpStream, msg: &[u8]) -> io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "a DNS message over 65,535 bytes",
        )
    })?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    tcp.write_all(&framed).await
}

/// Whether a connection taken on the outbound listener was to port 53 (DNS over TCP).
pub(crate) fn is_dns(tcp: &TcpStream) -> bool {
    ferry_runtime::sockets::original_dst(tcp).is_ok_and(|d| d.port() == super::DOMAIN_PORT)
}
