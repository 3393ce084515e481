//! A small authoritative DNS server over UDP and TCP on one port (hickory-server, zones given
//! as zone-file text): the upstream resolver of the node proxy's DNS proxy in its tests and in
//! the lab (`ferry lab dns-upstream`). Feature `dns-server`; no Ferry program serves DNS with it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::LowerName;
use hickory_proto::serialize::txt::Parser;
use hickory_server::Server;
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};

/// Why a zone server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ZoneServerError {
    #[error("zone {index}: {detail}")]
    Zone { index: usize, detail: String },
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running server; it stops when dropped.
pub struct ZoneServer {
    /// Where it answers, over UDP and TCP.
    pub addr: SocketAddr,
    server: Server<Catalog>,
}

impl std::fmt::Debug for ZoneServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZoneServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ZoneServer {
    /// Serves `zones` (each the text of a zone file, with its `$ORIGIN` and SOA) on `addr`
    /// (port 0: one the UDP socket is given, which the TCP listener then takes too; when
    /// another process holds that port over TCP, another one is tried).
    pub async fn start(zones: &[&str], addr: SocketAddr) -> Result<Self, ZoneServerError> {
        let mut catalog = Catalog::new();
        for (index, text) in zones.iter().enumerate() {
            let zone = |detail: String| ZoneServerError::Zone { index, detail };
            let (origin, records) = Parser::new(*text, None, None)
                .parse()
                .map_err(|e| zone(e.to_string()))?;
            let handler: InMemoryZoneHandler = InMemoryZoneHandler::new(
                origin.clone(),
                records,
                ZoneType::Primary,
                AxfrPolicy::Deny,
            )
            .map_err(zone)?;
            catalog.upsert(LowerName::new(&origin), vec![Arc::new(handler)]);
        }
        let (udp, tcp) = bind_both(addr).await?;
        let addr = udp
            .local_addr()
            .map_err(|source| ZoneServerError::Bind { addr, source })?;
        let mut server = Server::new(catalog);
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(10), 64);
        Ok(Self { addr, server })
    }

    /// Serves until the server stops (for a process that does nothing else).
    pub async fn run(mut self) {
        if let Err(e) = self.server.block_until_done().await {
            tracing::error!(error = %e, "the DNS server stopped");
        }
    }
}

/// How many ephemeral ports are tried when the one UDP is given is taken over TCP.
const EPHEMERAL_TRIES: usize = 16;

/// A UDP socket and a TCP listener on one port: `addr`'s, or when that is 0 an ephemeral one
/// free for both (the UDP socket picks it; a process may hold it over TCP, so a few are tried).
async fn bind_both(
    addr: SocketAddr,
) -> Result<(tokio::net::UdpSocket, tokio::net::TcpListener), ZoneServerError> {
    let bind = |source| ZoneServerError::Bind { addr, source };
    let tries = if addr.port() == 0 { EPHEMERAL_TRIES } else { 1 };
    let mut last = None;
    for _ in 0..tries {
        let udp = tokio::net::UdpSocket::bind(addr).await.map_err(bind)?;
        let port = udp.local_addr().map_err(bind)?;
        match tokio::net::TcpListener::bind(port).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(bind(e)),
        }
    }
    Err(bind(last.unwrap_or_else(|| {
        std::io::Error::from(std::io::ErrorKind::AddrInUse)
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn port_zero_gives_one_port_both_protocols_answer_on() {
        let (udp, tcp) = bind_both("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert_eq!(udp.local_addr().unwrap(), tcp.local_addr().unwrap());
    }

    #[tokio::test]
    async fn a_given_port_taken_over_tcp_is_an_error_naming_it() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        match bind_both(addr).await {
            Err(ZoneServerError::Bind {
                addr: named,
                source,
            }) => {
                assert_eq!(named, addr);
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
            }
            other => panic!("a taken port must fail to bind, got {other:?}"),
        }
    }
}
