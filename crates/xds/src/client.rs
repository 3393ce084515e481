//! The xDS subscriber in `ferry node`.
//!
//! Subscribes to workloads/services and policies; decodes every resource before touching shared
//! state; applies a push as one snapshot swap, made incrementally from the snapshot it replaces
//! ([`crate::incremental`]); ACKs, or NACKs naming each rejected resource;
//! reconnects with exponential backoff and jitter, sending what it holds so that only the
//! difference comes back; keeps serving the last good snapshot meanwhile; and reports ready
//! only after the first full sync of both types.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ferry_api::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use ferry_api::google::rpc::Status as RpcStatus;
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_core::random::{Random, SplitMix64};
use ferry_core::store::Store;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::assemble::Held;
use crate::convert::{self, Interner, InvalidResource};
use crate::incremental::{self, Changed};

mod decode;
pub mod framing;
mod stream;

/// The node metadata key under which a data-plane program gives the address of its admin
/// endpoint (`IP:port`), so that the control plane's mesh map can gather its records.
pub const ADMIN_ADDRESS_KEY: &str = "FERRY_ADMIN_ADDRESS";

/// Where and how to reach the control plane.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `https://ip:port` (or `http://` with `plaintext`).
    pub endpoint: String,
    pub bundle_pem: String,
    pub server_name: String,
    pub token: String,
    pub cluster: String,
    pub node_id: String,
    /// Local experiments only: no TLS. Logged loudly.
    pub plaintext: bool,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

/// Resource name -> version. A workload's name is its uid, and the map holds the workload's
/// own copy of it: a node of a million workloads keeps each name once, not once more here.
/// Ordered: a first push (sorted by name) is built into full nodes at once, about 34 bytes a
/// resource, where a hash table of a million grows to two million slots of 33.
pub type Versions = BTreeMap<Arc<str>, Box<str>>;

/// What a client has received, shared with observers (admin endpoints, tests).
#[derive(Debug, Default)]
pub struct ClientState {
    pub held: Held,
    /// Per type: resource name -> version, exactly the resources applied.
    pub versions: HashMap<String, Versions>,
    pub generation: u64,
    /// The last rejected resources, as sent in the NACK.
    pub last_rejected: Vec<InvalidResource>,
    /// Connection attempts, successful or not.
    pub attempts: u64,
    /// Streams that were opened.
    pub sessions: u64,
    /// Resources received in the current session (for observing what a reconnect costs).
    pub received_this_session: u64,
    /// Why the last session failed (cleared when a session applies a response): what a
    /// one-shot subscriber reports when no sync comes.
    pub last_error: Option<String>,
}

/// The running subscriber.
#[derive(Debug, Clone)]
pub struct XdsClient {
    config: ClientConfig,
    /// Reread at each connect when set ([`XdsClient::with_token_file`]).
    token_file: Option<std::path::PathBuf>,
    /// Sent as the xDS node's metadata ([`XdsClient::with_metadata`]).
    metadata: BTreeMap<String, String>,
    store: Arc<Store>,
    state: Arc<Mutex<ClientState>>,
    ready: watch::Sender<bool>,
    /// The version of the newest snapshot applied.
    changes: watch::Sender<u64>,
    /// Names and maps the decoded resources share (one push is decoded at a time).
    intern: Arc<Mutex<Interner>>,
}

impl XdsClient {
    pub fn new(config: ClientConfig, store: Arc<Store>) -> Self {
        if config.plaintext {
            tracing::warn!(endpoint = %config.endpoint, "xDS over PLAINTEXT: configuration can be read and forged on the way");
        }
        Self {
            config,
            token_file: None,
            metadata: BTreeMap::new(),
            store,
            state: Arc::new(Mutex::new(ClientState::default())),
            ready: watch::channel(false).0,
            changes: watch::channel(0).0,
            intern: Arc::default(),
        }
    }

    /// Rereads the credential from `path` at each connect: a projected Kubernetes
    /// service-account token is rotated by the kubelet while the process runs. The configured
    /// token stands in while the file cannot be read or is empty.
    #[must_use]
    pub fn with_token_file(mut self, path: std::path::PathBuf) -> Self {
        self.token_file = Some(path);
        self
    }

    /// Sends `metadata` (string values) as the node's metadata on every stream: a node proxy
    /// tells the control plane its admin address this way ([`ADMIN_ADDRESS_KEY`]).
    #[must_use]
    pub fn with_metadata(mut self, metadata: BTreeMap<String, String>) -> Self {
        self.metadata = metadata;
        self
    }

    /// The credential to send on the next stream.
    fn token(&self) -> String {
        let Some(path) = &self.token_file else {
            return self.config.token.clone();
        };
        // A few hundred bytes on a tmpfs, once per connect.
        match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) => self.config.token.clone(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "the token file could not be read; sending the token read at start");
                self.config.token.clone()
            }
        }
    }

    /// True once both types have been fully received.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Changes whenever a new snapshot is applied; its value is that snapshot's version. Open
    /// connections wait on it to be judged again (events, not polling).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn state(&self) -> Arc<Mutex<ClientState>> {
        self.state.clone()
    }

    /// Runs forever: sessions, and backoff between them.
    pub async fn run(self) {
        let mut backoff = self.config.backoff_initial;
        let mut rng = SplitMix64::new(jitter_seed(&self.config.node_id));
        loop {
            let progressed = match self.session().await {
                Ok(p) => {
                    tracing::info!("xDS stream closed by the control plane");
                    p
                }
                Err((p, e)) => {
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "xDS session failed; keeping the last good state");
                    self.state.lock().last_error = Some(e);
                    p
                }
            };
            if progressed {
                backoff = self.config.backoff_initial;
            }
            let jitter = backoff.mul_f64(rng.below(1000) as f64 / 2000.0);
            tokio::time::sleep(backoff + jitter).await;
            backoff = (backoff * 2).min(self.config.backoff_max);
        }
    }

    /// One stream. Returns whether any response was applied, with the error if it failed.
    async fn session(&self) -> Result<bool, (bool, String)> {
        let c = &self.config;
        self.state.lock().attempts += 1;
        let fail = |e: String| (false, e);
        if !c.plaintext && !c.endpoint.starts_with("https://") {
            return Err(fail(format!(
                "{} is not an https:// address (plaintext needs the explicit option)",
                c.endpoint
            )));
        }
        let mut endpoint = Endpoint::from_shared(c.endpoint.clone())
            .map_err(|e| fail(e.to_string()))?
            .connect_timeout(Duration::from_secs(5));
        if !c.plaintext {
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&c.bundle_pem))
                .domain_name(&c.server_name);
            endpoint = endpoint.tls_config(tls).map_err(|e| fail(e.to_string()))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| fail(format!("connect: {}", with_sources(&e))))?;
        let (tx, rx) = mpsc::channel(16);
        {
            let mut st = self.state.lock();
            st.sessions += 1;
            st.received_this_session = 0;
            for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
                let initial = st.versions.get(type_url).into_iter().flatten();
                let req = DeltaDiscoveryRequest {
                    node: Some(Node {
                        id: c.node_id.clone(),
                        cluster: c.cluster.clone(),
                        metadata: metadata_struct(&self.metadata),
                    }),
                    type_url: type_url.to_string(),
                    resource_names_subscribe: vec!["*".to_string()],
                    initial_resource_versions: initial
                        .map(|(name, version)| (name.to_string(), version.to_string()))
                        .collect(),
                    ..Default::default()
                };
                tx.try_send(req).map_err(|e| fail(e.to_string()))?;
            }
        }
        let token = self.token();
        let metadata = stream::Metadata {
            token: &token,
            cluster: &c.cluster,
        };
        let mut inbound = stream::open(channel, rx, metadata)
            .await
            .map_err(|s| fail(format!("{}: {}", s.code(), s.message())))?;
        let mut synced: BTreeMap<String, bool> = BTreeMap::new();
        let mut progressed = false;
        loop {
            let response = match inbound.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(progressed),
                Err(s) => return Err((progressed, format!("{}: {}", s.code(), s.message()))),
            };
            let type_url = response.type_url.clone();
            let ack = self.apply(response);
            progressed = true;
            synced.insert(type_url, true);
            if tx.send(ack).await.is_err() {
                return Err((progressed, "the request stream closed".into()));
            }
            if synced.len() == 2 {
                self.ready.send_replace(true);
            }
        }
    }

    /// Applies one response as a session does with each it receives, and returns its ACK or
    /// NACK (public for benches, which feed responses without a stream). The response is
    /// consumed: each resource's body is freed as soon as it is decoded.
    pub fn apply(&self, mut response: DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
        let resources = std::mem::take(&mut response.resources);
        let received = resources.len() as u64;
        let r = &response;
        // Phase 1, no lock: decode every resource (a large push on every core).
        let decode::DecodedPush {
            mut addresses,
            mut policies,
            mut rejected,
        } = decode::decode(&mut self.intern.lock(), &r.type_url, resources);
        // Phase 2: one update of the held state, one snapshot, one swap.
        let mut st = self.state.lock();
        st.last_error = None;
        st.received_this_session += received;
        // The versions to record, and the held resources with the snapshot, are updated
        // side by side for a large push (a first sync): neither reads the other.
        let recorded: Vec<(Arc<str>, Box<str>)> = addresses
            .iter_mut()
            .map(|(name, version, _)| (name.clone(), std::mem::take(version).into_boxed_str()))
            .chain(policies.iter_mut().map(|(name, version, _)| {
                let version = std::mem::take(version).into_boxed_str();
                (Arc::from(name.as_str()), version)
            }))
            .collect();
        let apart = recorded.len() >= VERSIONS_APART_MIN;
        let current = self.store.load();
        st.generation += 1;
        let generation = st.generation;
        let state = &mut *st;
        let versions = state.versions.entry(r.type_url.clone()).or_default();
        let held = &mut state.held;
        let record = || record_versions(versions, &r.removed_resources, recorded, &rejected);
        let update = || {
            let changed = hold(held, r, addresses, policies, &rejected, &current);
            incremental::update(held, &current, &changed, generation)
        };
        let incremental::Update {
            snapshot: snap,
            set_aside,
            ..
        } = if apart {
            std::thread::scope(|s| {
                let recording = s.spawn(record);
                let update = update();
                // Recording does not panic; if it did, the panic goes on as if on one thread.
                recording
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p));
                update
            })
        } else {
            record();
            update()
        };
        drop(current);
        for bad in &set_aside {
            for v in st.versions.values_mut() {
                v.remove(bad.name.as_str());
            }
        }
        rejected.extend(set_aside);
        match snap {
            Some(snap) => {
                let version = snap.version();
                self.store.publish(snap);
                self.changes.send_replace(version);
            }
            None => {
                tracing::error!("no consistent snapshot from this push; keeping the last good one")
            }
        }
        st.last_rejected.clone_from(&rejected);
        drop(st);
        let error_detail = (!rejected.is_empty()).then(|| {
            let message = rejected.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            tracing::warn!(type_url = %r.type_url, rejected = rejected.len(), detail = %message, "NACK");
            RpcStatus { code: tonic::Code::InvalidArgument as i32, message, details: vec![] }
        });
        DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            error_detail,
            ..Default::default()
        }
    }
}

/// Resources in a push from which the client records their versions on another thread.
const VERSIONS_APART_MIN: usize = 8_192;

/// Records the versions of a push's resources (`recorded`: name, version) in `versions`, and
/// forgets those of what it removed and what was rejected.
fn record_versions(
    versions: &mut Versions,
    removed: &[String],
    recorded: Vec<(Arc<str>, Box<str>)>,
    rejected: &[InvalidResource],
) {
    for name in removed {
        versions.remove(name.as_str());
    }
    if versions.is_empty() {
        // A first push: built at once (the last of a name twice is kept, as inserted).
        *versions = recorded.into_iter().collect();
    } else {
        for (name, version) in recorded {
            // Removed first: `insert` would keep the old key, the uid of a workload replaced.
            versions.remove(&name);
            versions.insert(name, version);
        }
    }
    for bad in rejected {
        versions.remove(bad.name.as_str());
    }
}

/// Holds a push's resources in `held` (removals and rejections dropped), and returns what
/// was held under every name the push touches, before, when the push can be applied as a
/// delta on `current`. The first push, or one after a push that made no snapshot, is
/// assembled in full ([`incremental::update`]) and records nothing.
fn hold(
    held: &mut Held,
    r: &DeltaDiscoveryResponse,
    addresses: Vec<(Arc<str>, String, convert::Decoded)>,
    policies: Vec<(String, String, ferry_core::model::Policy)>,
    rejected: &[InvalidResource],
    current: &ferry_core::snapshot::Snapshot,
) -> Changed {
    let mut changed = Changed::default();
    let as_delta = held.index.synced == Some(current.version());
    let touched = r
        .removed_resources
        .iter()
        .map(String::as_str)
        .chain(rejected.iter().map(|bad| bad.name.as_str()))
        .chain(addresses.iter().map(|(name, _, _)| &**name))
        .chain(policies.iter().map(|(name, _, _)| name.as_str()))
        .filter(|_| as_delta);
    for name in touched {
        if r.type_url == ADDRESS_TYPE {
            let was = held.addresses.get(name).cloned();
            changed.addresses.entry(name.to_string()).or_insert(was);
        } else {
            let was = held.policies.get(name).cloned();
            changed.policies.entry(name.to_string()).or_insert(was);
        }
    }
    for name in &r.removed_resources {
        if r.type_url == ADDRESS_TYPE {
            held.addresses.remove(name.as_str());
        } else {
            held.policies.remove(name);
        }
    }
    for bad in rejected {
        // A resource that no longer decodes is no longer held: fail closed.
        if r.type_url == ADDRESS_TYPE {
            held.addresses.remove(bad.name.as_str());
        } else {
            held.policies.remove(&bad.name);
        }
    }
    if held.addresses.is_empty() {
        // A first push: built from its sorted names at once, not searched name by name.
        held.addresses = addresses.into_iter().map(|(n, _, d)| (n, d)).collect();
    } else {
        for (name, _, d) in addresses {
            // Removed first, as in the versions: the new workload's uid is the key.
            held.addresses.remove(&name);
            held.addresses.insert(name, d);
        }
    }
    for (name, _, p) in policies {
        held.policies.insert(name, Arc::new(p));
    }
    changed
}

/// `e` and the errors under it: a transport error's own text says only "transport error".
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// `metadata` as a protobuf `Struct` of strings; `None` when empty.
fn metadata_struct(metadata: &BTreeMap<String, String>) -> Option<prost_types::Struct> {
    (!metadata.is_empty()).then(|| prost_types::Struct {
        fields: metadata
            .iter()
            .map(|(k, v)| {
                let value = prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(v.clone())),
                };
                (k.clone(), value)
            })
            .collect(),
    })
}

/// Differs per node and per start, so nodes do not reconnect in lockstep.
fn jitter_seed(node_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node_id.hash(&mut h);
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    h.finish()
}
