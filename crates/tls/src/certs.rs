//! The certificate manager: one worker per identity, one CSR at a time per identity.
//!
//! ```text
//!            fetch / prefetch
//!                  |
//!   (none) --ensure--> Pending --signed--> Ready(cert) --refresh time--> (sign again)
//!                         |                    |  ^                           |
//!                       failed               failed: keep cert while valid    |
//!                         v                    v  |                           |
//!                 Failed(reason) <--expired-- Ready ----------signed-----------+
//! ```
//!
//! Time is tokio's, so tests pause and advance it. Validity comes from the certificate once, on
//! receipt, and is tracked on the monotonic clock from then on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ferry_core::identity::Identity;
use ferry_core::random::{Random, SplitMix64};
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ca_client::{CertificateSource, validity};
use crate::config::{Credentials, TrustBundle};

/// Manager settings.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// The lifetime asked of the CA (it may grant less).
    pub lifetime: Duration,
    /// Rotate when this fraction of the remaining lifetime has passed.
    pub refresh_fraction: f64,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long an on-demand fetch waits for a first certificate.
    pub fetch_wait: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            lifetime: Duration::from_secs(24 * 3600),
            refresh_fraction: 0.5,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(150),
            fetch_wait: Duration::from_secs(10),
        }
    }
}

/// A certificate and when it stops being usable.
#[derive(Debug)]
pub struct Issued {
    pub creds: Credentials,
    pub expires: Instant,
    pub refresh: Instant,
    pub not_after: SystemTime,
}

/// What the manager has for one identity.
#[derive(Clone, Debug)]
pub enum CertState {
    Pending,
    Ready(Arc<Issued>),
    /// No usable certificate; the last error.
    Failed(String),
}

/// Why no certificate can be handed out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CertError {
    #[error("no valid certificate for {identity} within {waited_ms} ms ({last})")]
    Unavailable {
        identity: Identity,
        waited_ms: u64,
        last: String,
    },
}

/// Per-identity certificate cache with background rotation.
#[derive(Clone, Debug)]
pub struct CertManager {
    inner: Arc<Inner>,
}

struct Inner {
    source: Arc<dyn CertificateSource>,
    config: ManagerConfig,
    slots: Mutex<HashMap<Identity, Slot>>,
    requests: AtomicU64,
    /// The roots that came with the newest certificate, as sent and as a bundle: how the trust
    /// bundle reaches the node. A certificate with the same roots keeps the bundle, and with it
    /// the chains verified to it ([`TrustBundle`]).
    bundle: Mutex<Option<(Vec<CertificateDer<'static>>, TrustBundle)>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManager")
            .field("identities", &self.slots.lock().len())
            .finish_non_exhaustive()
    }
}

struct Slot {
    state: watch::Receiver<CertState>,
    worker: JoinHandle<()>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.worker.abort();
    }
}

impl CertManager {
    pub fn new(source: Arc<dyn CertificateSource>, config: ManagerConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                config,
                slots: Mutex::new(HashMap::new()),
                requests: AtomicU64::new(0),
                bundle: Mutex::new(None),
            }),
        }
    }

    /// The mesh's trust bundle as of the newest certificate (every root the CA distributes, so a
    /// root rotation reaches the node with its next certificate).
    pub fn trust_bundle(&self) -> Option<TrustBundle> {
        self.inner.bundle.lock().as_ref().map(|(_, b)| b.clone())
    }

    /// CSRs sent so far (each sign attempt sends one).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// A valid certificate for `identity`, waiting for the first one if needed.
    pub async fn fetch(&self, identity: &Identity) -> Result<Credentials, CertError> {
        let mut rx = self.ensure(identity);
        let wait = self.inner.config.fetch_wait;
        let deadline = Instant::now() + wait;
        loop {
            let last = match &*rx.borrow_and_update() {
                CertState::Ready(i) if i.expires > Instant::now() => return Ok(i.creds.clone()),
                CertState::Ready(_) => "the certificate expired".to_string(),
                CertState::Pending => "waiting for the CA".to_string(),
                CertState::Failed(e) => e.clone(),
            };
            let unavailable = || CertError::Unavailable {
                identity: identity.clone(),
                waited_ms: wait.as_millis() as u64,
                last: last.clone(),
            };
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Err(unavailable()),
            }
        }
    }

    /// Starts fetching certificates for these identities ahead of their first connection.
    pub fn prefetch<'a>(&self, identities: impl IntoIterator<Item = &'a Identity>) {
        for id in identities {
            self.ensure(id);
        }
    }

    /// Drops every identity not in `keep` (workloads that left the node), and its key.
    pub fn retain(&self, keep: &HashSet<Identity>) {
        self.inner.slots.lock().retain(|id, _| keep.contains(id));
    }

    /// The current state of every identity, for the admin endpoint.
    pub fn states(&self) -> Vec<(Identity, CertState)> {
        let mut v: Vec<_> = self
            .inner
            .slots
            .lock()
            .iter()
            .map(|(id, s)| (id.clone(), s.state.borrow().clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    fn ensure(&self, identity: &Identity) -> watch::Receiver<CertState> {
        let mut slots = self.inner.slots.lock();
        if let Some(s) = slots.get(identity) {
            return s.state.clone();
        }
        let (tx, rx) = watch::channel(CertState::Pending);
        let worker = tokio::spawn(work(Arc::downgrade(&self.inner), identity.clone(), tx));
        slots.insert(
            identity.clone(),
            Slot {
                state: rx.clone(),
                worker,
            },
        );
        rx
    }
}

/// Keeps one identity's certificate fresh until the slot is dropped.
async fn work(inner: std::sync::Weak<Inner>, identity: Identity, tx: watch::Sender<CertState>) {
    let mut rng = SplitMix64::new(jitter_seed(&identity));
    let mut current: Option<Arc<Issued>> = None;
    let mut backoff = match inner.upgrade() {
        Some(i) => i.config.backoff_initial,
        None => return,
    };
    loop {
        let Some(this) = inner.upgrade() else { return };
        let config = this.config.clone();
        this.requests.fetch_add(1, Ordering::Relaxed);
        let source = this.source.clone();
        drop(this);
        match source.sign(&identity, config.lifetime).await {
            Ok(creds) => {
                if let Some(this) = inner.upgrade() {
                    keep_roots(&mut this.bundle.lock(), &creds);
                }
                let issued = Arc::new(schedule(creds, &config));
                tracing::info!(identity = %identity, expires_in_s = (issued.expires - Instant::now()).as_secs(), "certificate ready");
                let refresh = issued.refresh;
                current = Some(issued.clone());
                tx.send_replace(CertState::Ready(issued));
                backoff = config.backoff_initial;
                tokio::time::sleep_until(refresh).await;
            }
            Err(e) => {
                let now = Instant::now();
                let still_valid = current.as_ref().filter(|c| c.expires > now).cloned();
                tracing::warn!(identity = %identity, error = %e, keeping_valid_certificate = still_valid.is_some(), retry_in_ms = backoff.as_millis() as u64, "certificate request failed");
                if still_valid.is_none() {
                    current = None;
                    tx.send_replace(CertState::Failed(e.to_string()));
                }
                // Exponential backoff with up to 50% jitter, but wake at expiry to stop using it.
                let jitter = backoff.mul_f64((rng.below(1000) as f64) / 2000.0);
                let mut wake = now + backoff + jitter;
                if let Some(c) = &still_valid {
                    wake = wake.min(c.expires);
                }
                tokio::time::sleep_until(wake).await;
                if still_valid
                    .as_ref()
                    .is_some_and(|c| c.expires <= Instant::now())
                {
                    current = None;
                    tx.send_replace(CertState::Failed(format!(
                        "the certificate expired while the CA was failing: {e}"
                    )));
                }
                backoff = (backoff * 2).min(config.backoff_max);
            }
        }
    }
}

/// When a new certificate expires and should be refreshed, on the monotonic clock.
fn schedule(creds: Credentials, config: &ManagerConfig) -> Issued {
    let now = Instant::now();
    let wall = SystemTime::now();
    let (not_after, left) = match validity(&creds) {
        Some((_, not_after)) => (
            not_after,
            not_after.duration_since(wall).unwrap_or(Duration::ZERO),
        ),
        None => (wall, Duration::ZERO),
    };
    Issued {
        creds,
        expires: now + left,
        refresh: now + left.mul_f64(config.refresh_fraction),
        not_after,
    }
}

fn jitter_seed(identity: &Identity) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    identity.hash(&mut h);
    SystemTime::now().hash(&mut h);
    h.finish()
}

/// Takes the roots the CA sent after the leaf as the bundle, unless they are the ones it holds.
fn keep_roots(held: &mut Option<(Vec<CertificateDer<'static>>, TrustBundle)>, creds: &Credentials) {
    let Some(rest) = creds.chain().get(1..) else {
        return;
    };
    if held
        .as_ref()
        .is_some_and(|(roots, _)| roots.as_slice() == rest)
    {
        return;
    }
    if let Ok(bundle) = TrustBundle::from_der(rest.iter().cloned()) {
        *held = Some((rest.to_vec(), bundle));
    }
}
