//! A simulated node proxy for benches and tests of the xDS server: a real delta-ADS client over
//! real TLS that decodes every resource it receives and keeps only what a reconnect needs (name
//! -> version per type), plus the capacity of the workloads it is asked to watch. It builds no
//! snapshot, so a hundred of them fit in one process at 100,000 workloads; `ferry_xds`'s
//! `XdsClient` is the real node proxy's client.
//!
//! It reads a response only when [`Sim::next`] is called: a caller that stops calling it is a
//! stalled node (its HTTP/2 window, [`SimConfig::window`], fills and the server must stop
//! sending).

use std::collections::HashMap;
use std::time::Duration;

use ferry_api::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ferry_api::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// Where a simulated node connects, and as whom.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The control plane's address (TLS, server name [`crate::app::SERVER_NAME`]).
    pub addr: std::net::SocketAddr,
    /// The trust bundle (PEM) that verifies the control plane.
    pub bundle_pem: String,
    /// The node's bootstrap token.
    pub token: String,
    /// The node's name (the xDS `Node.id` is `ferry~NAME`).
    pub node: String,
    /// The HTTP/2 stream window the node grants (bytes); `None` for the transport's default.
    pub window: Option<u32>,
}

/// Why a simulated node failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("connecting to {addr}: {message}")]
    Connect {
        addr: std::net::SocketAddr,
        message: String,
    },
    #[error("the xDS stream failed: {0}")]
    Stream(#[from] tonic::Status),
    #[error("resource {name} of {type_url} does not decode: {source}")]
    Decode {
        name: String,
        type_url: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("the request stream closed")]
    Closed,
}

/// One connected simulated node.
#[derive(Debug)]
pub struct Sim {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    inbound: tonic::Streaming<DeltaDiscoveryResponse>,
    /// Per type: resource name -> version, as applied.
    pub versions: HashMap<String, HashMap<String, String>>,
    /// The capacity of each watched workload resource, as last received.
    pub watched: HashMap<String, Option<u32>>,
    /// Responses received, per type.
    pub responses: HashMap<String, u64>,
}

/// What one response carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub type_url: String,
    pub upserts: usize,
    pub removed: usize,
    /// The names of the resources it carried, in its order.
    pub names: Vec<String>,
    /// Its `removed_resources`.
    pub removed_names: Vec<String>,
    /// Whether a watched resource was in it.
    pub watched: bool,
}

// === impl Sim ===

impl Sim {
    /// Connects over TLS and subscribes to both types (wildcard, nothing held); `watch` names
    /// the workload resources whose capacity [`Sim::watched`] keeps.
    pub async fn connect(config: &SimConfig, watch: &[&str]) -> Result<Self, SimError> {
        Self::connect_subscribed(config, watch, None).await
    }

    /// Connects as [`Sim::connect`], but subscribes to addresses on demand: only `names` (as
    /// ztunnel's on-demand mode does: `*` subscribed and unsubscribed in the same request, so
    /// that no name means nothing rather than everything). Policies are still a wildcard.
    pub async fn connect_on_demand(
        config: &SimConfig,
        watch: &[&str],
        names: &[&str],
    ) -> Result<Self, SimError> {
        Self::connect_subscribed(config, watch, Some(names)).await
    }

    /// Subscribes to and unsubscribes from address names later in the stream.
    pub async fn subscribe(
        &self,
        subscribe: &[&str],
        unsubscribe: &[&str],
    ) -> Result<(), SimError> {
        self.requests
            .send(DeltaDiscoveryRequest {
                type_url: ADDRESS_TYPE.to_string(),
                resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
                resource_names_unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            })
            .await
            .map_err(|_| SimError::Closed)
    }

    async fn connect_subscribed(
        config: &SimConfig,
        watch: &[&str],
        on_demand: Option<&[&str]>,
    ) -> Result<Self, SimError> {
        let fail = |message: String| SimError::Connect {
            addr: config.addr,
            message,
        };
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&config.bundle_pem))
            .domain_name(crate::app::SERVER_NAME);
        let channel = Endpoint::from_shared(format!("https://{}", config.addr))
            .map_err(|e| fail(e.to_string()))?
            .connect_timeout(Duration::from_secs(10))
            .initial_stream_window_size(config.window)
            .tls_config(tls)
            .map_err(|e| fail(e.to_string()))?
            .connect()
            .await
            .map_err(|e| fail(format!("{e:?}")))?;
        let mut client =
            AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(200 << 20);
        let (tx, rx) = mpsc::channel(16);
        for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
            let (subscribe, unsubscribe) = match on_demand {
                Some(names) if type_url == ADDRESS_TYPE => {
                    let mut subscribe = vec!["*".to_string()];
                    subscribe.extend(names.iter().map(|n| n.to_string()));
                    (subscribe, vec!["*".to_string()])
                }
                _ => (vec!["*".to_string()], vec![]),
            };
            tx.try_send(DeltaDiscoveryRequest {
                node: Some(Node {
                    id: format!("ferry~{}", config.node),
                    cluster: "east".into(),
                    metadata: None,
                }),
                type_url: type_url.to_string(),
                resource_names_subscribe: subscribe,
                resource_names_unsubscribe: unsubscribe,
                ..Default::default()
            })
            .map_err(|_| SimError::Closed)?;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        let bearer = format!("Bearer {}", config.token)
            .parse()
            .map_err(|_| fail("the token is not a header value".into()))?;
        request.metadata_mut().insert("authorization", bearer);
        let inbound = client
            .delta_aggregated_resources(request)
            .await?
            .into_inner();
        Ok(Self {
            requests: tx,
            inbound,
            versions: HashMap::new(),
            watched: watch.iter().map(|n| (n.to_string(), None)).collect(),
            responses: HashMap::new(),
        })
    }

    /// Reads, decodes and applies one response, and ACKs it; `None` when the server ended the
    /// stream.
    pub async fn next(&mut self) -> Result<Option<Received>, SimError> {
        let Some(r) = self.inbound.message().await? else {
            return Ok(None);
        };
        let mut watched = false;
        let versions = self.versions.entry(r.type_url.clone()).or_default();
        for res in &r.resources {
            let body = res
                .resource
                .as_ref()
                .map(|a| a.value.as_slice())
                .unwrap_or_default();
            let decode_error = |source| SimError::Decode {
                name: res.name.clone(),
                type_url: r.type_url.clone(),
                source,
            };
            if r.type_url == ADDRESS_TYPE {
                let a = ferry_api::workload::Address::decode(body).map_err(decode_error)?;
                if let Some(slot) = self.watched.get_mut(&res.name) {
                    watched = true;
                    *slot = match a.r#type {
                        Some(ferry_api::workload::address::Type::Workload(w)) => w.capacity,
                        _ => None,
                    };
                }
            } else {
                ferry_api::security::Authorization::decode(body).map_err(decode_error)?;
            }
            versions.insert(res.name.clone(), res.version.clone());
        }
        for name in &r.removed_resources {
            versions.remove(name);
        }
        *self.responses.entry(r.type_url.clone()).or_default() += 1;
        self.requests
            .send(DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                ..Default::default()
            })
            .await
            .map_err(|_| SimError::Closed)?;
        Ok(Some(Received {
            type_url: r.type_url,
            upserts: r.resources.len(),
            removed: r.removed_resources.len(),
            names: r.resources.into_iter().map(|r| r.name).collect(),
            removed_names: r.removed_resources,
            watched,
        }))
    }

    /// Whether both types have had their first response.
    pub fn synced(&self) -> bool {
        self.responses.contains_key(ADDRESS_TYPE) && self.responses.contains_key(AUTHORIZATION_TYPE)
    }

    /// The capacity last received for watched resource `name`.
    pub fn capacity(&self, name: &str) -> Option<u32> {
        self.watched.get(name).copied().flatten()
    }
}
