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
    /// (port 0: one the UDP socket is given, which the TCP listener then takes too).
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
        let bind = |source| ZoneServerError::Bind { addr, source };
        let udp = tokio::net::UdpSocket::bind(addr).await.map_err(bind)?;
        let addr = udp.local_addr().map_err(bind)?;
        let tcp = tokio::net::TcpListener::bind(addr).await.map_err(bind)?;
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
