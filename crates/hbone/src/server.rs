//! The HBONE server: mutual TLS, then HTTP/2 CONNECT streams, each checked before any byte
//! reaches its target, then forwarded with half-close and reset propagation.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use ferry_core::hop::PeerCluster;
use ferry_core::identity::Identity;
use ferry_tls::config::{Credentials, TrustBundle, peer_cluster, peer_identity, server_config};
use http::{HeaderMap, Response};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::copy;
use crate::error::Error;
use crate::error::Side;
use crate::headers::{self, Refusal, Target};
use crate::keepalive::{Held, Streams, When, ping_until_dead};
use crate::settings::{Settings, tune_socket, widen_tls_buffer};
use crate::stream::H2Stream;
use crate::upstream::Forward;

// Kept at its old path while other crates move; new code names `crate::socket::reset_tcp`.
pub use crate::socket::reset_tcp;

/// What the server knows about one CONNECT when it asks the handler.
#[derive(Clone, Debug)]
pub struct ConnectRequest {
    /// Unique in this process: names the tunnel in logs and load-balancing seeds.
    pub id: u64,
    /// The mutual-TLS peer's SPIFFE identity (verified, same trust domain as ours); one per
    /// HBONE connection, shared by its streams.
    pub peer: Arc<Identity>,
    /// The cluster the mesh CA bound into that same verified certificate, or
    /// [`PeerCluster::Unproven`] if it carries none (another trust source). This connection's
    /// own peer: at the destination of double HBONE, the inner tunnel's client (the gateway
    /// only forwards its bytes). What scope is checked against; never the baggage. Shared like
    /// `peer`.
    pub peer_cluster: Arc<PeerCluster>,
    /// The TCP address the tunnel connection came from.
    pub peer_addr: SocketAddr,
    pub target: Target,
    /// The CONNECT's headers, for [`Handler::admit`] and [`Handler::connect`]: emptied once
    /// the tunnel is up, so that a held tunnel does not keep them (read them in `connect` at
    /// the latest).
    pub headers: HeaderMap,
    /// The trace id of the CONNECT's `traceparent`, kept for the tunnel's life (16 bytes, not
    /// the headers): every hop records it, so one connection's records can be joined.
    pub trace_id: Option<u128>,
}

/// Decides about and serves CONNECT requests. Supplied by the node proxy, waypoint or gateway.
///
/// For each CONNECT the server calls [`Handler::admit`] before any byte reaches the target; if
/// it admits the request, [`Handler::connect`] with what `admit` decided, then, whatever happens
/// next (the target unreachable, the client gone, the copy done or reset),
/// [`Handler::finished`] exactly once with that same value and how the tunnel ended. What a
/// handler learns about a tunnel is therefore derived once and carried, never looked up again.
pub trait Handler: Send + Sync + 'static {
    /// What `admit` decided about one tunnel (its plan, labels, log fields): carried to
    /// `connect` and `finished`.
    type Admit: Send + 'static;

    /// Runs before any byte reaches the target; an error refuses the request with its status.
    fn admit(&self, request: &ConnectRequest) -> Result<Self::Admit, Refusal>;

    /// Opens the connection to the target, or hands the tunnel to the handler to serve. By
    /// default: TCP to an `ip:port` target.
    fn connect(
        &self,
        request: &ConnectRequest,
        admitted: &mut Self::Admit,
    ) -> impl Future<Output = Result<Forward, Refusal>> + Send {
        let _ = admitted;
        let target = request.target.clone();
        async move { connect_tcp(&target).await }
    }

    /// Called once per admitted tunnel when it ends. For access logs and metrics; by default
    /// nothing.
    fn finished(&self, request: &ConnectRequest, admitted: Self::Admit, outcome: &Outcome<'_>) {
        let _ = (request, admitted, outcome);
    }
}

/// How an admitted tunnel ended.
#[derive(Debug)]
pub enum Ended<'a> {
    /// Both directions finished cleanly (or the handler served the tunnel in process).
    Complete,
    /// `connect` refused: the target could not be reached; the client got this refusal.
    Refused(&'a Refusal),
    /// The client went away before the tunnel was up.
    ClientGone(&'a h2::Error),
    /// A direction failed or stayed quiet past the bound; the other side was reset.
    Reset(&'a copy::RelayError),
    /// The handler's [`Forward::until`] ended it, for this reason; both sides were reset.
    Closed(&'a (dyn std::error::Error + Send + Sync + 'static)),
}

/// What a tunnel moved, and how it ended.
#[derive(Debug)]
pub struct Outcome<'a> {
    /// Bytes from the client to the target.
    pub sent: u64,
    /// Bytes from the target to the client.
    pub received: u64,
    pub ended: Ended<'a>,
}

// === impl Outcome ===

impl Outcome<'_> {
    /// Which side failed, if the tunnel did not complete.
    pub fn failed(&self) -> Option<Side> {
        match &self.ended {
            Ended::Complete => None,
            Ended::Refused(_) => Some(Side::Upstream),
            Ended::ClientGone(_) => Some(Side::Downstream),
            Ended::Reset(e) => Some(match e.copy.failed {
                _ if e.copy.timed_out() => Side::Local,
                copy::Failed::A => Side::Downstream,
                copy::Failed::B => Side::Upstream,
            }),
            Ended::Closed(_) => Some(Side::Local),
        }
    }

    /// The failure in words, if the tunnel did not complete.
    pub fn error(&self) -> Option<String> {
        match &self.ended {
            Ended::Complete => None,
            Ended::Refused(r) => Some(r.to_string()),
            Ended::ClientGone(e) => Some(format!("client went away: {e}")),
            Ended::Reset(e) => Some(e.to_string()),
            Ended::Closed(reason) => Some(format!("closed: {reason}")),
        }
    }
}

/// The default connect: TCP to an `ip:port` target.
pub(crate) async fn connect_tcp(target: &Target) -> Result<Forward, Refusal> {
    match target {
        Target::Addr(addr) => TcpStream::connect(addr)
            .await
            .map(Forward::from)
            .map_err(|e| Refusal::Unavailable(format!("connect to {addr}: {e}"))),
        Target::Host { hostname, port } => Err(Refusal::Unavailable(format!(
            "no resolver for hostname target {hostname}:{port}"
        ))),
    }
}

/// Accepts HBONE connections for one local identity.
pub struct Server {
    acceptor: TlsAcceptor,
    trust_domain: String,
    settings: Settings,
    /// When it turns true, every connection is told to stop opening streams (GOAWAY).
    drain: Option<tokio::sync::watch::Receiver<bool>>,
    finish: Option<tokio::sync::watch::Receiver<bool>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

impl Server {
    pub fn new(
        creds: &Credentials,
        bundle: &TrustBundle,
        settings: Settings,
    ) -> Result<Self, Error> {
        Ok(Self {
            acceptor: TlsAcceptor::from(server_config(creds, bundle)?),
            trust_domain: creds.identity().trust_domain().to_string(),
            settings,
            drain: None,
            finish: None,
        })
    }

    /// Connections get a GOAWAY when `drain` turns true: clients finish what they have and
    /// open new streams elsewhere.
    pub fn drain_on(mut self, drain: tokio::sync::watch::Receiver<bool>) -> Self {
        self.drain = Some(drain);
        self
    }

    /// When `finish` turns true (the drain deadline), every tunnel still open is ended cleanly:
    /// END_STREAM towards the client, FIN towards the target; the connection, already sent a
    /// GOAWAY, then closes with a TLS close_notify.
    pub fn finish_on(mut self, finish: tokio::sync::watch::Receiver<bool>) -> Self {
        self.finish = Some(finish);
        self
    }

    /// Accepts connections from `listener` forever, each served on its own task.
    pub async fn serve<H: Handler>(
        self: Arc<Self>,
        listener: TcpListener,
        handler: Arc<H>,
    ) -> io::Result<()> {
        loop {
            let (tcp, peer) = listener.accept().await?;
            let (server, handler) = (self.clone(), handler.clone());
            tokio::spawn(async move {
                if let Err(e) = server.serve_connection(tcp, peer, handler).await {
                    tracing::debug!(peer.addr = %peer, error = %e, "HBONE connection closed with an error");
                }
            });
        }
    }

    /// Serves one accepted TCP connection until it closes.
    pub async fn serve_connection<H: Handler>(
        &self,
        tcp: TcpStream,
        peer_addr: SocketAddr,
        handler: Arc<H>,
    ) -> Result<(), Error> {
        tune_socket(&tcp, &self.settings);
        let timeout = self.settings.connect_timeout;
        let mut tls = tokio::time::timeout(timeout, self.acceptor.accept(tcp))
            .await
            .map_err(|_| Error::Timeout {
                doing: "accepting a TLS handshake",
                after_ms: timeout.as_millis() as u64,
            })?
            .map_err(|source| Error::Handshake {
                addr: peer_addr,
                source,
            })?;
        let certs = tls.get_ref().1.peer_certificates();
        let bad_peer = |reason| Error::PeerCertificate {
            addr: peer_addr,
            reason,
        };
        let peer = Peer {
            identity: Arc::new(peer_identity(certs, &self.trust_domain).map_err(bad_peer)?),
            cluster: Arc::new(PeerCluster::from_certificate(
                peer_cluster(certs).map_err(bad_peer)?,
            )),
            addr: peer_addr,
        };
        // HBONE is HTTP/2 only: a client that offered no ALPN (rustls lets that through) is
        // refused here, as one offering only others is refused in the handshake.
        widen_tls_buffer(&mut **tls.get_mut().1);
        let alpn = tls.get_ref().1.alpn_protocol();
        if alpn != Some(ferry_tls::config::ALPN_H2) {
            return Err(Error::Alpn {
                addr: peer_addr,
                found: alpn.map(|p| String::from_utf8_lossy(p).into_owned()),
            });
        }
        // The client preface and SETTINGS are bounded like the TLS handshake: an authenticated
        // peer that never sends them does not hold a connection open.
        let handshake = h2::server::Builder::new()
            .initial_window_size(self.settings.stream_window)
            .initial_connection_window_size(self.settings.connection_window)
            .max_frame_size(self.settings.max_frame_size)
            .max_concurrent_streams(self.settings.max_concurrent_streams)
            .max_header_list_size(64 << 10)
            .max_send_buffer_size(400 << 10)
            .handshake::<_, Bytes>(tls);
        let mut conn = tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| Error::Timeout {
                doing: "waiting for the HTTP/2 preface after TLS",
                after_ms: timeout.as_millis() as u64,
            })?
            .map_err(|source| Error::H2 {
                addr: peer_addr,
                source,
            })?;
        let pings = conn.ping_pong();
        let (interval, ping_timeout) = (self.settings.ping_interval, self.settings.ping_timeout);
        let bounds = copy::Bounds {
            half_closed_idle: self.settings.half_closed_idle,
            finish: self.finish.clone(),
        };
        // PINGs only while streams are open: an idle connection is the kernel's to watch
        // (TCP keepalive), and runs no code here ([`crate::keepalive`]).
        let open = Arc::new(Streams::default());
        let keepalive = async {
            match pings {
                Some(p) => ping_until_dead(p, When::Busy(&open), interval, ping_timeout).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(keepalive);
        let mut drain = self.drain.clone();
        let mut goaway_sent = false;
        // Its streams' tasks: the connection is served until they have ended too, so that
        // whoever waits on it (a drain) also waits for every handler's `finished`, even when
        // the peer closed the connection under them.
        let streams = tokio_util::task::TaskTracker::new();
        let served: Result<(), Error> = async {
            loop {
                let draining = async {
                    match drain.as_mut() {
                        Some(d) if !goaway_sent => {
                            let _ = d.wait_for(|v| *v).await;
                        }
                        _ => std::future::pending::<()>().await,
                    }
                };
                let next = tokio::select! {
                    next = conn.accept() => next,
                    () = draining => {
                        conn.graceful_shutdown();
                        goaway_sent = true;
                        continue;
                    }
                    why = &mut keepalive => {
                        tracing::info!(peer.addr = %peer_addr, src.identity = %peer.identity, reason = why, "closing HBONE connection");
                        return Ok(());
                    }
                };
                let Some(next) = next else { break };
                let (request, respond) = next.map_err(|source| Error::H2 {
                    addr: peer_addr,
                    source,
                })?;
                let (handler, bounds) = (handler.clone(), bounds.clone());
                let held = Held::new(&open);
                streams.spawn(serve_stream(request, respond, peer.clone(), handler, bounds, held));
            }
            Ok(())
        }
        .await;
        // Without its driver the streams still open fail at once (they are told the
        // connection ended) instead of waiting on it.
        drop(conn);
        streams.close();
        streams.wait().await;
        served
    }
}

/// The verified peer of one HBONE connection, read once from its certificate at the handshake
/// and shared by every stream on it (a held tunnel keeps two pointers, not copies).
#[derive(Clone)]
struct Peer {
    identity: Arc<Identity>,
    cluster: Arc<PeerCluster>,
    addr: SocketAddr,
}

/// A tunnel that is up: what its handler admitted and connected, the client's side of it, and
/// its far side.
struct Opened<A> {
    req: ConnectRequest,
    admitted: A,
    tunnel: H2Stream,
    forward: Forward,
}

/// How a tunnel that was up ended (owned: [`Outcome`] borrows from it).
enum End {
    Complete(u64, u64),
    Reset(copy::RelayError),
    Closed {
        reason: Box<dyn std::error::Error + Send + Sync>,
        a_to_b: u64,
        b_to_a: u64,
    },
}

/// One CONNECT stream from `peer`. A plain function returning the future: an `async fn` would
/// store its arguments twice for the tunnel's whole life. Opening the tunnel (admit, connect,
/// the response) runs boxed and is freed once it is up; what is held while the tunnel lives is
/// only what the copy and `finished` need. `held` counts the stream open on its connection
/// until the future ends (taken here: a future wrapped around this one in an `async` block
/// would store it twice, 1.8 KiB more per held tunnel, measured).
fn serve_stream<H: Handler>(
    request: http::Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
    peer: Peer,
    handler: Arc<H>,
    bounds: copy::Bounds,
    held: Held,
) -> impl Future<Output = ()> + Send {
    let opening = Box::pin(open_stream(request, respond, peer, handler.clone()));
    async move {
        let _held = held;
        let Some(opened) = opening.await else {
            return;
        };
        let end = carry(opened.tunnel, opened.forward, bounds).await;
        let req = &opened.req;
        let outcome = match &end {
            End::Complete(sent, received) => {
                tracing::debug!(src.identity = %req.peer, dst.addr = %req.target, bytes_sent = sent, bytes_recv = received, "tunnel complete");
                Outcome {
                    sent: *sent,
                    received: *received,
                    ended: Ended::Complete,
                }
            }
            End::Reset(e) => {
                tracing::debug!(src.identity = %req.peer, dst.addr = %req.target, error = %e, "tunnel reset");
                Outcome {
                    sent: e.copy.a_to_b,
                    received: e.copy.b_to_a,
                    ended: Ended::Reset(e),
                }
            }
            End::Closed {
                reason,
                a_to_b,
                b_to_a,
            } => {
                tracing::debug!(src.identity = %req.peer, dst.addr = %req.target, reason = %reason, "tunnel closed by its handler");
                Outcome {
                    sent: *a_to_b,
                    received: *b_to_a,
                    ended: Ended::Closed(&**reason),
                }
            }
        };
        handler.finished(&opened.req, opened.admitted, &outcome);
    }
}

/// Carries an open tunnel to its far side: copies it (until the handler's `until`, if any) or
/// lets the handler serve it (counted by the stream itself, as no copy loop counts it). On an
/// error, the side that did not fail is reset (both after the half-closed idle bound, or when
/// `until` ends the tunnel).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn stores its arguments twice, for as long as a connection is held"
)]
fn carry(
    mut tunnel: H2Stream,
    forward: Forward,
    bounds: copy::Bounds,
) -> impl Future<Output = End> + Send {
    async move {
        let (mut upstream, until) = match forward {
            Forward::Stream(u) => (u, None),
            Forward::Guarded { upstream, until } => (upstream, Some(until)),
            Forward::Serve(serve) => {
                let (tunnel, moved) = tunnel.counted();
                serve(tunnel).await;
                return End::Complete(moved.read(), moved.written());
            }
        };
        let until = async {
            match until {
                Some(u) => u.await,
                None => std::future::pending().await,
            }
        };
        match copy::relay_until(&mut tunnel, &mut upstream, bounds, until).await {
            Ok((sent, received)) => End::Complete(sent, received),
            Err(copy::Interrupted::Failed(e)) => End::Reset(e),
            Err(copy::Interrupted::Until {
                reason,
                a_to_b,
                b_to_a,
            }) => End::Closed {
                reason,
                a_to_b,
                b_to_a,
            },
        }
    }
}

/// Admits and connects one CONNECT, then answers it: `Some` once the tunnel is up (`200` sent);
/// `None` if it was refused (the handler's `finished` already called if it had admitted it).
async fn open_stream<H: Handler>(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    peer: Peer,
    handler: Arc<H>,
) -> Option<Opened<H::Admit>> {
    let refuse = |respond: &mut h2::server::SendResponse<Bytes>, r: &Refusal| {
        tracing::info!(src.identity = %peer.identity, src.addr = %peer.addr, status = r.status().as_u16(), reason = %r, "CONNECT refused");
        let response = Response::builder()
            .status(r.status())
            .body(())
            .expect("static response");
        let _ = respond.send_response(response, true);
    };
    let authority = request.uri().authority().map(|a| a.as_str().to_string());
    let target = match headers::parse_request(request.method(), authority.as_deref()) {
        Ok(t) => t,
        Err(r) => {
            refuse(&mut respond, &r);
            return None;
        }
    };
    let (parts, body) = request.into_parts();
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let mut req = ConnectRequest {
        id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        peer: peer.identity.clone(),
        peer_cluster: peer.cluster.clone(),
        peer_addr: peer.addr,
        target,
        trace_id: headers::trace_id(&parts.headers),
        headers: parts.headers,
    };
    let mut admitted = match handler.admit(&req) {
        Ok(a) => a,
        Err(r) => {
            refuse(&mut respond, &r);
            return None;
        }
    };
    // Boxed: the stream's task keeps only what the copy needs while the tunnel lives.
    let forward = match Box::pin(handler.connect(&req, &mut admitted)).await {
        Ok(f) => f,
        Err(r) => {
            refuse(&mut respond, &r);
            let outcome = Outcome {
                sent: 0,
                received: 0,
                ended: Ended::Refused(&r),
            };
            handler.finished(&req, admitted, &outcome);
            return None;
        }
    };
    // Read by `admit` and `connect`; not held for the tunnel's life.
    req.headers = HeaderMap::new();
    let ok = Response::builder()
        .status(http::StatusCode::OK)
        .body(())
        .expect("static response");
    match respond.send_response(ok, false) {
        Ok(send) => Some(Opened {
            req,
            admitted,
            tunnel: H2Stream::new(send, body),
            forward,
        }),
        Err(e) => {
            tracing::debug!(error = %e, "client went away before the tunnel was up");
            let outcome = Outcome {
                sent: 0,
                received: 0,
                ended: Ended::ClientGone(&e),
            };
            handler.finished(&req, admitted, &outcome);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    impl Handler for Nothing {
        type Admit = ();
        fn admit(&self, _: &ConnectRequest) -> Result<(), Refusal> {
            Ok(())
        }
    }

    fn size_of_output<F, A, B, C, D, E, G, Fut>(_: F) -> usize
    where
        F: FnOnce(A, B, C, D, E, G) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// A held tunnel's task holds this future for the tunnel's whole life: it was 2,240 bytes
    /// while it kept its arguments twice and the CONNECT's parts beside the copy.
    #[test]
    fn a_held_tunnel_keeps_a_small_future() {
        let size = size_of_output(serve_stream::<Nothing>);
        assert!(size <= 1536, "serve_stream's future is {size} bytes");
    }
}
