//! Double HBONE: a tunnel inside a tunnel, to cross into another network through its east-west
//! gateway.
//!
//! ```text
//!  client ==[outer mTLS: peer = the gateway]==> gateway --raw bytes--> destination node proxy
//!         \__[inner mTLS: peer = the destination, end to end; the gateway cannot read it]__/
//! ```
//! The outer tunnel (pooled) asks the gateway for `hostname:port`; the gateway picks an endpoint
//! on its network and forwards the inner bytes without terminating them. Inside, a new TLS
//! session and HTTP/2 connection (never pooled; made by the same [`client::handshake`] as any
//! other, so with the same timeout, PING keepalive and limits) carry a CONNECT to the same
//! `hostname:port` with `x-forwarded-network`, so the destination sees the original identity.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use ferry_core::identity::Identity;
use ferry_tls::config::{Credentials, TrustBundle};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::client;
use crate::error::Error;
use crate::headers::ConnectHeaders;
use crate::pool::Tunnel;
use crate::settings::Settings;
use crate::stream::H2Stream;

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

impl crate::copy::Reset for Inner {
    fn reset(&mut self) {
        self.abort();
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
    // The same handshake as every other HBONE connection: timeouts, PING keepalive, limits.
    let conn = client::handshake(outer, gateway, creds, bundle, accepted, settings).await?;
    let stream = conn.open(authority, headers).await?;
    // Dropping `conn` lets go of the right to open more streams; the connection lives as long
    // as this one.
    Ok(Inner { stream })
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
