//! `DeltaAggregatedResources` in `ferry control`: initial state on subscribe, then differences.
//!
//! Per stream and type the server remembers what the client holds, so a client that reconnects
//! receives only what changed: until the first push, the `initial_resource_versions` it sent
//! (name -> version); after it, the resource set last pushed, shared with every other stream
//! (an `Arc`, nothing copied per client). A stream's memory is therefore independent of the
//! mesh's size once it is synced, and the server holds no older set than the one each stream
//! was last brought to. The difference from one set to the next is computed once per change
//! and type ([`Diffs`]) and fanned out to every stream that held the same set. Every push
//! carries a nonce; a NACK (a request with that nonce and `error_detail`) is logged and counted.
//!
//! Flow control: a stream builds a response only once the transport has taken the one before
//! (one waits at most), so a node that stops reading (its HTTP/2 window full) stops the building
//! and costs the server no more memory however many edits come; when it reads again it gets one
//! difference from what it holds to the latest set, never each version in between. Changes are
//! pushed to a stream at most once per push interval ([`XdsServer::with_push_interval`],
//! [`DEFAULT_PUSH_INTERVAL`]): a change after a quiet interval goes out at once, the changes of
//! a burst within it go out together.
//!
//! Responses are framed here, not by tonic ([`framing`], [`route`]): a push is written a chunk
//! at a time from the difference shared by every stream, so a synced node costs the server no
//! buffer the size of its largest push.

mod framing;
mod on_demand;
mod route;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use ferry_api::discovery::DeltaDiscoveryRequest;
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_xds::resources::{Diff, ResourceSet, diff, diff_sets};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::{Request, Status, Streaming};

use self::framing::{Outgoing, TooLarge};
use self::on_demand::{Lookups, OnDemand};
pub use self::route::{AdsService, DELTA_PATH};

use crate::ca::auth::{Authenticate, Authenticated, Caller};
use crate::ca::k8s::K8sTokens;
use crate::ca::token::NodeTokens;
use crate::metrics::Metrics;
use crate::nodes::{Connected, Registration};

/// The ADS service.
#[derive(Debug, Clone)]
pub struct XdsServer {
    resources: watch::Receiver<Arc<ResourceSet>>,
    /// `None` only in the explicit plaintext, unauthenticated mode for local experiments.
    tokens: Option<Arc<NodeTokens>>,
    /// Kubernetes service-account tokens, when configured.
    k8s: Option<Arc<K8sTokens>>,
    metrics: Arc<Metrics>,
    diffs: Arc<Diffs>,
    /// The address index on-demand streams resolve names with.
    lookups: Arc<Lookups>,
    connected: Arc<Connected>,
    /// The least time between two pushes of changes on one stream.
    push_interval: Duration,
    /// Says `true` once `resources` holds the first complete set (see
    /// [`XdsServer::with_first_set`]).
    first: Option<watch::Receiver<bool>>,
}

/// The default of [`XdsServer::with_push_interval`].
pub const DEFAULT_PUSH_INTERVAL: Duration = Duration::from_millis(5);

impl XdsServer {
    pub fn new(
        resources: watch::Receiver<Arc<ResourceSet>>,
        tokens: Option<Arc<NodeTokens>>,
    ) -> Self {
        if tokens.is_none() {
            tracing::warn!(
                "xDS serves WITHOUT node authentication: anyone who can connect reads the mesh's configuration"
            );
        }
        Self {
            resources,
            tokens,
            k8s: None,
            metrics: Arc::new(Metrics::default()),
            diffs: Arc::default(),
            lookups: Arc::default(),
            connected: Arc::default(),
            push_interval: DEFAULT_PUSH_INTERVAL,
            first: None,
        }
    }

    /// Streams wait until `first` says `true`, which it does once the resources hold the first
    /// complete set: the control plane listens while that set is still being encoded, and a
    /// node is never sent the placeholder before it. A stream whose `first` ends before it says
    /// so ends.
    #[must_use]
    pub fn with_first_set(mut self, first: watch::Receiver<bool>) -> Self {
        self.first = Some(first);
        self
    }

    /// Pushes a change to a stream no sooner than `interval` after its last push of one: the
    /// changes made meanwhile (a burst of edits) go out together, as one difference from what
    /// the node holds to the latest set. A change after a quiet interval goes out at once.
    #[must_use]
    pub fn with_push_interval(mut self, interval: Duration) -> Self {
        self.push_interval = interval;
        self
    }

    /// Also accepts Kubernetes service-account tokens (checked from the headers too).
    #[must_use]
    pub fn with_k8s(mut self, k8s: Option<Arc<K8sTokens>>) -> Self {
        self.k8s = k8s;
        self
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The programs with an open stream, with the admin addresses they gave.
    pub fn connected(&self) -> Arc<Connected> {
        self.connected.clone()
    }

    /// The tonic server: the credential checked from the headers before any request on the
    /// stream is decoded (requests carry a reconnecting client's resource versions, so they may
    /// be large, but only for a node with a valid credential).
    pub fn into_server(self) -> XdsServerService {
        let auth = Authenticate::new(
            self.tokens.clone(),
            tonic::Code::Unauthenticated,
            "xDS stream",
            self.metrics.refused.clone(),
        )
        .with_k8s(self.k8s.clone());
        auth.layer(AdsService { xds: self })
    }
}

/// The largest xDS request decoded from an authenticated node.
pub const MAX_REQUEST_BYTES: usize = 200 << 20;

/// The service as served.
pub type XdsServerService = Authenticated<AdsService>;

/// The most bytes of a push handed to the transport at once (a resource larger than this goes
/// alone): what a stream holds of a push beyond the difference every stream shares.
pub const CHUNK_BYTES: usize = 64 << 10;

impl XdsServer {
    /// Opens a `DeltaAggregatedResources` stream for an authenticated request: its task runs
    /// until the node hangs up or the served set's sender is dropped, and hands its responses'
    /// framed bytes over the returned channel as the transport takes them.
    fn open(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<mpsc::Receiver<Bytes>, Status> {
        let node = match (&self.tokens, request.extensions().get::<Caller>()) {
            (Some(_), Some(Caller(n))) => n.to_string(),
            (Some(tokens), None) => match Authenticate::verify(tokens, &request) {
                Ok(n) => n.to_string(),
                Err(e) => {
                    self.metrics.refused.inc();
                    tracing::warn!(reason = %e.message(), "xDS stream refused");
                    return Err(e);
                }
            },
            (None, _) => "(unauthenticated)".to_string(),
        };
        let peer = request.remote_addr();
        let cluster = request
            .metadata()
            .get("clusterid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.metrics.streams.inc();
        tracing::info!(node = %node, cluster = %cluster, "xDS stream opened");
        // One response waits for the transport at a time (see `Stream_::run`).
        let (tx, rx) = mpsc::channel(1);
        let stream = Stream_ {
            inbound: request.into_inner(),
            tx,
            resources: self.resources.clone(),
            diffs: self.diffs.clone(),
            lookups: self.lookups.clone(),
            _open: OpenStream::new(&self.metrics),
            metrics: self.metrics.clone(),
            node,
            peer,
            connected: self.connected.clone(),
            registration: None,
            push_interval: self.push_interval,
            first: self.first.clone(),
        };
        tokio::spawn(stream.run());
        Ok(rx)
    }
}

/// One client's stream.
struct Stream_ {
    inbound: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Bytes>,
    resources: watch::Receiver<Arc<ResourceSet>>,
    diffs: Arc<Diffs>,
    lookups: Arc<Lookups>,
    metrics: Arc<Metrics>,
    node: String,
    /// Where the stream comes from.
    peer: Option<std::net::SocketAddr>,
    connected: Arc<Connected>,
    /// Lists this stream's program in `connected` from its first request with a node.
    registration: Option<Registration>,
    push_interval: Duration,
    /// Until it says `true`, the resources are not yet the first set (nothing is read or sent).
    first: Option<watch::Receiver<bool>>,
    /// Counts this stream in `ferry_xds_streams_open` while it lives.
    _open: OpenStream,
}

/// What one client holds of one type.
enum Held {
    /// What it said it holds when it subscribed (name -> version), before the first push.
    Initial(HashMap<String, String>),
    /// Exactly this set's resources of the type: the set last pushed (shared, not copied).
    Set(Arc<ResourceSet>),
    /// Only what it named (an on-demand subscription, see [`on_demand`]).
    Named(OnDemand),
}

/// The differences between consecutive resource sets, per type, computed by the first stream
/// that needs one and reused by the others. Keyed by the two sets' allocations through `Weak`s:
/// a `Weak` keeps the allocation's address from being reused (so a key never matches another
/// set) but not the set's resources, so the cache keeps no old set alive.
///
/// A node that connects holding nothing gets the difference from [`Diffs::empty`] (an empty set
/// kept here, so its key stays valid): the initial sync of many nodes is computed once.
#[derive(Debug, Default)]
pub struct Diffs {
    recent: Mutex<Vec<CachedDiff>>,
    empty: Arc<ResourceSet>,
}

#[derive(Debug)]
struct CachedDiff {
    from: Weak<ResourceSet>,
    to: Weak<ResourceSet>,
    type_url: String,
    diff: Arc<Diff>,
}

/// Differences kept: both types of the last few changes.
const CACHED_DIFFS: usize = 8;

/// One open stream, counted in a gauge while it lives.
struct OpenStream(prometheus_client::metrics::gauge::Gauge);

// === impl Diffs ===

impl Diffs {
    /// What a client holding exactly `from`'s resources of `type_url` needs to match `to`'s.
    fn between(&self, from: &Arc<ResourceSet>, to: &Arc<ResourceSet>, type_url: &str) -> Arc<Diff> {
        let hit = |c: &CachedDiff| {
            c.type_url == type_url
                && Weak::as_ptr(&c.from) == Arc::as_ptr(from)
                && Weak::as_ptr(&c.to) == Arc::as_ptr(to)
        };
        if let Some(c) = self.recent.lock().iter().find(|c| hit(c)) {
            return c.diff.clone();
        }
        // Computed without the lock: two streams may both compute the same difference once.
        let empty = Default::default();
        let d = Arc::new(diff_sets(
            from.of_type(type_url).unwrap_or(&empty),
            to.of_type(type_url).unwrap_or(&empty),
        ));
        let mut recent = self.recent.lock();
        // Entries whose sets are gone can never match again.
        recent.retain(|c| c.from.strong_count() > 0 && c.to.strong_count() > 0);
        if recent.len() >= CACHED_DIFFS {
            recent.remove(0);
        }
        recent.push(CachedDiff {
            from: Arc::downgrade(from),
            to: Arc::downgrade(to),
            type_url: type_url.to_string(),
            diff: d.clone(),
        });
        d
    }
}

// === impl OpenStream ===

impl OpenStream {
    fn new(metrics: &Metrics) -> Self {
        metrics.streams_open.inc();
        Self(metrics.streams_open.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Stream_ {
    /// Reads the client's requests and pushes as the transport takes responses: a response is
    /// built only once the one before it has been taken (the channel holds one), so a client
    /// that stops reading stops the building, and when it reads again it is brought from what
    /// it holds to the latest set in one difference per type. At most one change is pushed per
    /// [`XdsServer::with_push_interval`]; the changes within it go out as one.
    async fn run(mut self) {
        if let Some(mut first) = self.first.take() {
            if first.wait_for(|made| *made).await.is_err() {
                tracing::warn!(node = %self.node, "xDS stream ended: the first resource set was never made");
                return;
            }
            // The first set is what the stream starts from, not a change to push.
            self.resources.borrow_and_update();
        }
        let mut types: HashMap<String, Held> = HashMap::new();
        let mut nonce = 0u64;
        // Types subscribed and not yet answered, in order.
        let mut first: VecDeque<String> = VecDeque::new();
        // Built from one change, sent a chunk at a time as room is made (at most two: a
        // change's two types).
        let mut queue: VecDeque<Outgoing> = VecDeque::new();
        // The served set changed since the last push.
        let mut stale = false;
        let mut last_push: Option<Instant> = None;
        loop {
            let ready_at = last_push.map(|t| t + self.push_interval);
            let due = ready_at.is_none_or(|t| Instant::now() >= t);
            let work = !queue.is_empty() || !first.is_empty() || (stale && due);
            tokio::select! {
                biased;
                msg = self.inbound.message() => {
                    let req = match msg {
                        Ok(Some(r)) => r,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(node = %self.node, error = %e, "xDS stream ended");
                            break;
                        }
                    };
                    if let Some(type_url) = self.request(&mut types, req) {
                        first.push_back(type_url);
                    }
                }
                changed = self.resources.changed(), if !stale => {
                    if changed.is_err() {
                        break;
                    }
                    stale = true;
                }
                permit = self.tx.clone().reserve_owned(), if work => {
                    let Ok(permit) = permit else {
                        break;
                    };
                    if queue.is_empty() {
                        if let Some(type_url) = first.pop_front() {
                            let current = self.resources.borrow().clone();
                            match self.push(&mut types, &type_url, &current, &mut nonce, true) {
                                Ok(out) => queue.extend(out),
                                Err(e) => {
                                    self.too_large(&e);
                                    break;
                                }
                            }
                        } else {
                            // One set for every type of this change: no type may miss it.
                            let current = self.resources.borrow_and_update().clone();
                            stale = false;
                            last_push = Some(Instant::now());
                            let mut urls: Vec<String> = types.keys().cloned().collect();
                            // Policies before addresses: a workload never references a policy
                            // the node does not have yet (no window without its ALLOW policy).
                            urls.sort_by_key(|t| t.as_str() != AUTHORIZATION_TYPE);
                            let mut refused = None;
                            for t in urls {
                                match self.push(&mut types, &t, &current, &mut nonce, false) {
                                    Ok(out) => queue.extend(out),
                                    Err(e) => refused = Some(e),
                                }
                            }
                            if let Some(e) = refused {
                                self.too_large(&e);
                                break;
                            }
                        }
                    }
                    if let Some(response) = queue.front_mut() {
                        let chunk = response.next_chunk(CHUNK_BYTES);
                        if response.is_done() {
                            queue.pop_front();
                        }
                        if let Some(chunk) = chunk {
                            permit.send(chunk);
                        }
                    }
                }
                () = sleep_until_or_never(ready_at), if stale && !due => {}
            }
        }
    }

    /// Takes one request: counts ACKs and NACKs and returns the type when it subscribes to one
    /// for the first time on this stream (its `initial_resource_versions` kept in `types`).
    fn request(
        &mut self,
        types: &mut HashMap<String, Held>,
        req: DeltaDiscoveryRequest,
    ) -> Option<String> {
        if self.registration.is_none()
            && let Some(n) = &req.node
        {
            self.registration = Some(self.connected.register(&self.node, n, self.peer));
        }
        if req.type_url != ADDRESS_TYPE && req.type_url != AUTHORIZATION_TYPE {
            tracing::debug!(node = %self.node, type_url = %req.type_url, "ignoring an unknown type");
            return None;
        }
        if !req.response_nonce.is_empty() {
            match &req.error_detail {
                Some(e) => {
                    self.metrics.nacks.inc();
                    tracing::warn!(node = %self.node, type_url = %req.type_url, nonce = %req.response_nonce, detail = %e.message, "xDS NACK");
                }
                None => {
                    self.metrics.acks.inc();
                }
            }
        }
        match types.get_mut(&req.type_url) {
            // A later request of an on-demand subscription: answered when it names something new.
            Some(Held::Named(names)) => names
                .request(
                    req.resource_names_subscribe,
                    &req.resource_names_unsubscribe,
                )
                .then_some(req.type_url),
            // A wildcard subscription already gets everything.
            Some(_) => None,
            None => {
                let initial = req.initial_resource_versions.into_iter().collect();
                let held = if on_demand::is_wildcard(
                    &req.resource_names_subscribe,
                    &req.resource_names_unsubscribe,
                ) {
                    Held::Initial(initial)
                } else {
                    tracing::debug!(node = %self.node, type_url = %req.type_url, names = req.resource_names_subscribe.len(), "on-demand subscription");
                    Held::Named(OnDemand::new(
                        initial,
                        req.resource_names_subscribe,
                        &req.resource_names_unsubscribe,
                    ))
                };
                types.insert(req.type_url.clone(), held);
                Some(req.type_url)
            }
        }
    }

    /// Ends a stream whose next response cannot be framed (see [`TooLarge`]).
    fn too_large(&self, e: &TooLarge) {
        tracing::error!(node = %self.node, type_url = %e.type_url, bytes = e.len, max = e.max, "xDS response over gRPC's message limit: closing the stream");
    }

    /// What the client lacks of `type_url` (always a response on the first push and to a
    /// request naming something new; none when nothing changed). The client is taken to hold
    /// `current`'s resources (of what it subscribed to) from then on.
    fn push(
        &self,
        types: &mut HashMap<String, Held>,
        type_url: &str,
        current: &Arc<ResourceSet>,
        nonce: &mut u64,
        first: bool,
    ) -> Result<Option<Outgoing>, TooLarge> {
        let Some(held) = types.get_mut(type_url) else {
            return Ok(None);
        };
        let d = match held {
            Held::Named(names) => {
                let lookup = (type_url == ADDRESS_TYPE).then(|| self.lookups.of(current));
                let empty = Default::default();
                let d = names.push(
                    current.of_type(type_url).unwrap_or(&empty),
                    lookup.as_deref(),
                    &self.node,
                );
                return self.respond(type_url, Arc::new(d), nonce, first);
            }
            Held::Set(prev) if Arc::ptr_eq(prev, current) => Arc::default(),
            Held::Set(prev) => self.diffs.between(prev, current, type_url),
            Held::Initial(known) if known.is_empty() => {
                self.diffs.between(&self.diffs.empty, current, type_url)
            }
            Held::Initial(known) => {
                let empty = Default::default();
                Arc::new(diff(known, current.of_type(type_url).unwrap_or(&empty)))
            }
        };
        // Whatever is sent below, the client then holds exactly `current`'s resources.
        *held = Held::Set(current.clone());
        self.respond(type_url, d, nonce, first)
    }

    /// The response carrying `d`: none when it is empty, unless one is owed.
    fn respond(
        &self,
        type_url: &str,
        d: Arc<Diff>,
        nonce: &mut u64,
        owed: bool,
    ) -> Result<Option<Outgoing>, TooLarge> {
        if d.is_empty() && !owed {
            return Ok(None);
        }
        *nonce += 1;
        self.metrics.pushes.inc();
        self.metrics.resources_sent.inc_by(d.upserts.len() as u64);
        tracing::debug!(node = %self.node, type_url, upserts = d.upserts.len(), removed = d.removed.len(), "xDS push");
        Outgoing::new(type_url, nonce.to_string(), d).map(Some)
    }
}

/// Sleeps until `at`; never wakes without one.
async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
