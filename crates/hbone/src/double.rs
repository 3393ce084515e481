//! Double HBONE: a tunnel inside a tunnel, to cross into another network through its east-west
//! gateway.
//!
//! ```text
//!  client ==[outer mTLS: peer = the gateway]==> gateway --raw bytes--> destination node proxy
//!         \__[inner mTLS: peer = the destination, end to end; the gateway cannot read it]__/
//! ```
//! The outer tunnel (pooled) asks the gateway for `hostname:port`; the gateway picks an endpoint
//! on its network and forwards the inner bytes without terminating them. Inside, a new TLS
//! session and HTTP/2 connection (never pooled) carry a CONNECT to the same `hostname:port`
//! with `x-forwarded-network`, so the destination sees the original identity.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use ferry_core::identity::Identity;
use http::{Method, Request, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsConnector;

use crate::error::Error;
use crate::headers::ConnectHeaders;
use crate::pool::Tunnel;
use crate::settings::Settings;
use crate::stream::H2Stream;
use crate::tls::{self, Credentials, TrustBundle};

/// The inner tunnel. Dropping it ends the inner connection and frees the outer stream.
#[derive(Debug)]
pub struct Inner {
    stream: H2Stream,
}

impl Inner {
    pub fn abort(&mut self) {
        self.stream.abort();
    }
}

#[allow(clippy::too_many_arguments)] // each argument is a distinct part of the inner handshake
/// Opens the inner tunnel over `outer` (a tunnel to the gateway, opened with the same
/// `authority`). `accepted` are the destination identities the inner handshake must see.
pub async fn open_inner(
    outer: Tunnel,
    gateway: std::net::SocketAddr,
    creds: &Credentials,
    bundle: &TrustBundle,
    accepted: Vec<Identity>,
    authority: &str,
    headers: &ConnectHeaders,
    settings: &Settings,
) -> Result<Inner, Error> {
    let addr = gateway;
    let config = tls::client_config(creds, bundle, accepted)?;
    let tls = TlsConnector::from(config)
        .connect(tls::server_name(addr), outer)
        .await
        .map_err(|source| match tls::IdentityMismatch::find(&source) {
            Some(m) => Error::PeerIdentity {
                addr,
                mismatch: m.clone(),
            },
            None => Error::Handshake { addr, source },
        })?;
    if tls.get_ref().1.alpn_protocol() != Some(tls::ALPN_H2) {
        return Err(Error::Alpn { addr, found: None });
    }
    let (send, driver) = h2::client::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .enable_push(false)
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(|source| Error::H2 { addr, source })?;
    tokio::spawn(async move {
        if let Err(e) = driver.await {
            tracing::debug!(gateway = %addr, error = %e, "inner HBONE connection ended");
        }
    });
    let h2err = |source| Error::H2 { addr, source };
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .version(Version::HTTP_2)
        .uri(authority)
        .body(())
        .map_err(|_| Error::BadAuthority(authority.to_string()))?;
    headers.write(request.headers_mut());
    let mut send = send.ready().await.map_err(h2err)?;
    let (response, stream) = send.send_request(request, false).map_err(h2err)?;
    let response = response.await.map_err(h2err)?;
    if response.status() != http::StatusCode::OK {
        return Err(Error::Refused {
            addr,
            authority: authority.to_string(),
            status: response.status().as_u16(),
        });
    }
    Ok(Inner {
        stream: H2Stream::new(stream, response.into_body()),
    })
}

impl AsyncRead for Inner {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Inner {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
