//! The certificate manager under a controlled clock (tokio's paused time), with the CA signing
//! in-process so that only time, not the network, decides what happens.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ferry_control::ca::signer::Ca;
use ferry_core::identity::Identity;
use ferry_tls::ca_client::{CertificateSource, FetchError, credentials, new_csr};
use ferry_tls::certs::{CertManager, CertState, ManagerConfig};
use ferry_tls::config::Credentials;

const A: &str = "spiffe://cluster.local/ns/default/sa/a";

fn id(s: &str) -> Identity {
    s.parse().unwrap()
}

/// Signs in-process; can be switched off to play a CA outage.
struct LocalCa {
    ca: Ca,
    down: AtomicBool,
    signed: AtomicU64,
}

impl CertificateSource for LocalCa {
    fn sign<'a>(
        &'a self,
        identity: &'a Identity,
        lifetime: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Credentials, FetchError>> + Send + 'a>> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                return Err(FetchError::Unavailable("connection refused".into()));
            }
            let (csr, key) = new_csr(identity)?;
            let chain = self
                .ca
                .sign(&csr, identity, &"c".into(), lifetime)
                .map_err(|e| FetchError::Refused(e.to_string()))?;
            self.signed.fetch_add(1, Ordering::SeqCst);
            credentials(identity, &chain, key)
        })
    }
}

fn setup() -> (Arc<LocalCa>, CertManager) {
    let source = Arc::new(LocalCa {
        ca: Ca::generate("cluster.local").unwrap(),
        down: AtomicBool::new(false),
        signed: AtomicU64::new(0),
    });
    let config = ManagerConfig {
        lifetime: Duration::from_secs(1000),
        refresh_fraction: 0.5,
        backoff_initial: Duration::from_secs(1),
        backoff_max: Duration::from_secs(16),
        fetch_wait: Duration::from_secs(5),
    };
    (source.clone(), CertManager::new(source, config))
}

/// Lets spawned workers run after the clock moved.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Moves the clock forward a second at a time, letting timers that fall due fire in order.
async fn advance(d: Duration) {
    let step = Duration::from_secs(1);
    let mut left = d;
    while left > Duration::ZERO {
        let s = left.min(step);
        tokio::time::advance(s).await;
        settle().await;
        left -= s;
    }
}

#[tokio::test(start_paused = true)]
async fn rotation_happens_at_half_life_before_expiry() {
    let (ca, m) = setup();
    let first = m.fetch(&id(A)).await.unwrap();
    assert_eq!(ca.signed.load(Ordering::SeqCst), 1);
    advance(Duration::from_secs(450)).await;
    assert_eq!(ca.signed.load(Ordering::SeqCst), 1, "not before half-life");
    advance(Duration::from_secs(60)).await;
    assert_eq!(
        ca.signed.load(Ordering::SeqCst),
        2,
        "rotated at half-life (~500 s of 1000 s)"
    );
    let second = m.fetch(&id(A)).await.unwrap();
    assert_ne!(first.chain()[0], second.chain()[0]);
}

#[tokio::test(start_paused = true)]
async fn a_valid_certificate_is_kept_while_the_ca_is_down_and_an_expired_one_never_used() {
    let (ca, m) = setup();
    let first = m.fetch(&id(A)).await.unwrap();
    ca.down.store(true, Ordering::SeqCst);
    advance(Duration::from_secs(600)).await; // past the refresh point: retries fail
    assert!(m.requests() > 2, "retries while the CA is down");
    let kept = m
        .fetch(&id(A))
        .await
        .expect("still valid at 600 s of 1000 s");
    assert_eq!(kept.chain()[0], first.chain()[0]);
    advance(Duration::from_secs(500)).await; // past expiry
    assert!(
        matches!(m.states()[0].1, CertState::Failed(_)),
        "{:?}",
        m.states()
    );
    let err = m
        .fetch(&id(A))
        .await
        .expect_err("an expired certificate is never handed out");
    assert!(err.to_string().contains("no valid certificate"), "{err}");
    // The CA comes back: the next retry succeeds.
    ca.down.store(false, Ordering::SeqCst);
    advance(Duration::from_secs(20)).await;
    assert!(m.fetch(&id(A)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn retries_back_off_exponentially_with_a_cap() {
    let (ca, m) = setup();
    ca.down.store(true, Ordering::SeqCst);
    m.prefetch([&id(A)]);
    settle().await;
    // Backoff 1, 2, 4, 8, 16, 16, ... s with up to 50% jitter: in 100 s that is between 9 and 13
    // attempts; without backoff it would be ~100, without a cap ~7.
    advance(Duration::from_secs(100)).await;
    let attempts = m.requests();
    assert!((8..=14).contains(&attempts), "{attempts} attempts in 100 s");
}

#[tokio::test(start_paused = true)]
async fn identities_that_leave_the_node_are_dropped() {
    let (_ca, m) = setup();
    let b = id("spiffe://cluster.local/ns/default/sa/b");
    m.prefetch([&id(A), &b]);
    settle().await;
    assert_eq!(m.states().len(), 2);
    m.retain(&HashSet::from([b.clone()]));
    let states = m.states();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].0, b);
}

/// Certificates that come with the same roots keep the node's trust bundle, and with it the
/// chains verified to it.
#[tokio::test(start_paused = true)]
async fn certificates_with_the_same_roots_keep_the_trust_bundle() {
    let (ca, m) = setup();
    m.fetch(&id(A)).await.unwrap();
    let first = m
        .trust_bundle()
        .expect("a bundle with the first certificate");
    m.fetch(&id("spiffe://cluster.local/ns/default/sa/b"))
        .await
        .unwrap();
    assert_eq!(ca.signed.load(Ordering::SeqCst), 2);
    let second = m.trust_bundle().expect("a bundle");
    assert!(first.is_same(&second), "a new bundle for the same roots");
}
