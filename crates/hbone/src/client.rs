//! The HBONE client: one mutual-TLS HTTP/2 connection, and CONNECT streams over it.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use ferry_core::identity::Identity;
use ferry_tls::config::{ALPN_H2, Credentials, TrustBundle, client_config, server_name};
use ferry_tls::error::IdentityMismatch;
use http::{Method, Request, Version};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use crate::error::Error;
use crate::headers::ConnectHeaders;
use crate::keepalive::{Streams, When, ping_until_dead};
use crate::settings::{Settings, tune_socket, widen_tls_buffer};
use crate::stream::H2Stream;

/// One HTTP/2 connection to an HBONE server.
#[derive(Debug)]
pub struct Connection {
    addr: SocketAddr,
    send: h2::client::SendRequest<Bytes>,
    /// Set when the connection's driver task ends (error, GOAWAY, or close).
    pub(crate) closed: Arc<AtomicBool>,
    /// Streams currently open (or reserved) on this connection, as its pool counts them: a
    /// pooled connection PINGs its peer only while there are some.
    pub(crate) streams: Arc<Streams>,
    /// Its sender is dropped when the connection's driver task ends (the connection is gone).
    pub(crate) ended: tokio::sync::watch::Receiver<()>,
}

impl Connection {
    /// Dials `addr` from `src` (unspecified: let the kernel choose) with `dialer` (for example
    /// [`DirectDialer`], or one inside a pod's network namespace), as `creds`, accepting a
    /// server that presents one of `accepted`. The dial and the [`handshake`] together take at
    /// most `settings.connect_timeout`. The connection PINGs its peer every
    /// `settings.ping_interval` for as long as it lives.
    pub async fn connect(
        dialer: &dyn Dialer,
        src: Option<IpAddr>,
        addr: SocketAddr,
        creds: &Credentials,
        bundle: &TrustBundle,
        accepted: Vec<Identity>,
        settings: &Settings,
    ) -> Result<Self, Error> {
        Self::dial(
            dialer,
            src,
            addr,
            creds,
            bundle,
            accepted,
            settings,
            Ping::Always,
        )
        .await
    }

    /// [`Connection::connect`] for a pool, which counts the streams it opens on it in
    /// `streams`: the connection PINGs its peer only while some are open, and leaves an idle
    /// one to the kernel's TCP keepalive ([`crate::keepalive`]).
    pub(crate) async fn connect_pooled(
        dialer: &dyn Dialer,
        src: Option<IpAddr>,
        addr: SocketAddr,
        creds: &Credentials,
        bundle: &TrustBundle,
        accepted: Vec<Identity>,
        settings: &Settings,
    ) -> Result<Self, Error> {
        Self::dial(
            dialer,
            src,
            addr,
            creds,
            bundle,
            accepted,
            settings,
            Ping::WhileStreams,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)] // `connect`'s, and how it PINGs
    async fn dial(
        dialer: &dyn Dialer,
        src: Option<IpAddr>,
        addr: SocketAddr,
        creds: &Credentials,
        bundle: &TrustBundle,
        accepted: Vec<Identity>,
        settings: &Settings,
        ping: Ping,
    ) -> Result<Self, Error> {
        let config = client_config(creds, bundle, accepted)?;
        let deadline = Instant::now() + settings.connect_timeout;
        let tcp = within(deadline, settings, async {
            dialer
                .dial(src, addr)
                .await
                .map_err(|source| Error::Connect { addr, source })
        })
        .await?;
        tune_socket(&tcp, settings);
        establish(tcp, addr, config, settings, deadline, ping).await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many concurrent streams the peer allows (its SETTINGS_MAX_CONCURRENT_STREAMS).
    pub(crate) fn peer_stream_limit(&self) -> usize {
        self.send.current_max_send_streams()
    }

    /// Marks the connection unusable (it failed to open a stream).
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the connection can no longer carry streams.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Opens a CONNECT stream to `authority` (`ip:port` or `hostname:port`): the one CONNECT
    /// path, for pooled connections and for the inner connection of double HBONE alike.
    pub async fn open(&self, authority: &str, headers: &ConnectHeaders) -> Result<H2Stream, Error> {
        let addr = self.addr;
        let h2err = |source| Error::H2 { addr, source };
        let mut request = Request::builder()
            .method(Method::CONNECT)
            .version(Version::HTTP_2)
            .uri(authority)
            .body(())
            .map_err(|_| Error::BadAuthority(authority.to_string()))?;
        headers.write(request.headers_mut());
        let mut send = self.send.clone().ready().await.map_err(|e| {
            self.closed.store(true, Ordering::Release);
            h2err(e)
        })?;
        let (response, stream) = send.send_request(request, false).map_err(h2err)?;
        let response = response.await.map_err(h2err)?;
        if response.status() != http::StatusCode::OK {
            return Err(Error::Refused {
                addr,
                authority: authority.to_string(),
                status: response.status().as_u16(),
            });
        }
        Ok(H2Stream::new(stream, response.into_body()))
    }
}

/// The client side of an HBONE connection over any byte stream: a TCP socket, or, for double
/// HBONE, an outer tunnel. The one TLS + HTTP/2 client handshake, so every connection gets the
/// same:
/// - mutual TLS 1.3, the server verified to be one of `accepted`, and ALPN `h2`;
/// - HTTP/2 with the [`Settings`] windows and frame size, a 16 KiB header-list limit (Istio's
///   client value), a send buffer of one stream window, and no push;
/// - a driver task that PINGs the peer every `ping_interval` and closes the connection when a
///   PING is not answered within `ping_timeout` (a pooled connection: only while it carries
///   streams, [`crate::keepalive`]);
/// - all within `settings.connect_timeout`.
///
/// `addr` names the peer in errors and logs (for double HBONE: the gateway).
pub async fn handshake<IO>(
    io: IO,
    addr: SocketAddr,
    creds: &Credentials,
    bundle: &TrustBundle,
    accepted: Vec<Identity>,
    settings: &Settings,
) -> Result<Connection, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = client_config(creds, bundle, accepted)?;
    let deadline = Instant::now() + settings.connect_timeout;
    establish(io, addr, config, settings, deadline, Ping::Always).await
}

/// When a client connection PINGs its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ping {
    /// Every `ping_interval` for as long as it lives.
    Always,
    /// Only while its [`Connection::streams`] count some open.
    WhileStreams,
}

/// The client's header-list limit (Istio's ztunnel: 16 KiB).
pub(crate) const MAX_HEADER_LIST: u32 = 16 << 10;

/// [`handshake`], by `deadline`.
async fn establish<IO>(
    io: IO,
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    settings: &Settings,
    deadline: Instant,
    ping: Ping,
) -> Result<Connection, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, driver) = within(deadline, settings, async {
        let mut tls = TlsConnector::from(config)
            .connect(server_name(addr), io)
            .await
            .map_err(|source| match IdentityMismatch::find(&source) {
                Some(m) => Error::PeerIdentity {
                    addr,
                    mismatch: m.clone(),
                },
                None => Error::Handshake { addr, source },
            })?;
        widen_tls_buffer(&mut **tls.get_mut().1);
        let alpn = tls.get_ref().1.alpn_protocol();
        if alpn != Some(ALPN_H2) {
            let found = alpn.map(|a| String::from_utf8_lossy(a).into_owned());
            return Err(Error::Alpn { addr, found });
        }
        h2::client::Builder::new()
            .initial_window_size(settings.stream_window)
            .initial_connection_window_size(settings.connection_window)
            .max_frame_size(settings.max_frame_size)
            .max_header_list_size(MAX_HEADER_LIST)
            .max_send_buffer_size(settings.stream_window as usize)
            .enable_push(false)
            .handshake::<_, Bytes>(tls)
            .await
            .map_err(|source| Error::H2 { addr, source })
    })
    .await?;
    let closed = Arc::new(AtomicBool::new(false));
    let (alive, ended) = tokio::sync::watch::channel(());
    let streams = Arc::new(Streams::default());
    let counted = (ping == Ping::WhileStreams).then(|| streams.clone());
    tokio::spawn(drive(
        driver,
        addr,
        settings.clone(),
        counted,
        closed.clone(),
        alive,
    ));
    Ok(Connection {
        addr,
        send,
        closed,
        streams,
        ended,
    })
}

/// Runs a client connection, with PING keepalive (only while `counted` has open streams, if
/// given), until it ends; then sets `closed` and drops `alive` (what
/// [`crate::pool::Pool::shutdown`] waits on).
async fn drive<IO>(
    mut driver: h2::client::Connection<IO, Bytes>,
    addr: SocketAddr,
    settings: Settings,
    counted: Option<Arc<Streams>>,
    closed: Arc<AtomicBool>,
    alive: tokio::sync::watch::Sender<()>,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let pings = driver.ping_pong();
    let when = counted.as_deref().map_or(When::Always, When::Busy);
    let keepalive = async {
        match pings {
            Some(p) => {
                ping_until_dead(p, when, settings.ping_interval, settings.ping_timeout).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = &mut driver => if let Err(e) = r {
            tracing::debug!(peer.addr = %addr, error = %e, "HBONE connection ended");
        },
        why = keepalive => {
            tracing::info!(peer.addr = %addr, reason = why, "closing HBONE connection");
        }
    }
    closed.store(true, Ordering::Release);
    drop(alive);
}

/// `work`, or [`Error::Timeout`] once `deadline` passes.
async fn within<T>(
    deadline: Instant,
    settings: &Settings,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout_at(deadline, work)
        .await
        .map_err(|_| Error::Timeout {
            doing: "connecting to an HBONE peer",
            after_ms: settings.connect_timeout.as_millis() as u64,
        })?
}

/// Makes the TCP connections tunnels ride on.
pub trait Dialer: Send + Sync + std::fmt::Debug + 'static {
    fn dial(
        &self,
        src: Option<IpAddr>,
        dst: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<TcpStream>> + Send + '_>>;
}

/// Dials from this process's own network namespace, bound to `src` when given.
#[derive(Debug, Default, Clone, Copy)]
pub struct DirectDialer;

impl Dialer for DirectDialer {
    fn dial(
        &self,
        src: Option<IpAddr>,
        dst: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<TcpStream>> + Send + '_>>
    {
        Box::pin(dial(src, dst))
    }
}

async fn dial(src: Option<IpAddr>, addr: SocketAddr) -> std::io::Result<TcpStream> {
    match src.filter(|ip| !ip.is_unspecified()) {
        None => TcpStream::connect(addr).await,
        Some(ip) => {
            let socket = if ip.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.bind(SocketAddr::new(ip, 0))?;
            socket.connect(addr).await
        }
    }
}
