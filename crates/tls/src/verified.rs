//! Chains already verified to one trust bundle, so that a handshake presenting the very same
//! certificates again skips their signature checks. A new mutual TLS connection made four ECDSA
//! verifications, two per end: the peer's chain to the bundle, and its handshake signature (its
//! proof that it holds the key). Between two node proxies the same few certificates come back at
//! every new connection, so the first is the same work each time: half of a new connection's
//! instructions were these four (`cargo bench -p ferry-hbone --bench instructions`, issue 21).
//!
//! What is remembered is exactly what was verified: the chain's bytes, end-entity first, for one
//! usage (a server's chain, serverAuth, or a client's, clientAuth), with the window in which
//! every certificate of it is valid. A chain is taken from here only if its bytes are equal, for
//! the same usage, at a time inside that window; anything else is verified as before, and only
//! a success is remembered. The handshake signature is verified at every handshake. The
//! remembered chains belong to one [`crate::config::TrustBundle`] (its clones share them): a
//! new bundle, as at a root rotation, starts with none, so a chain is never trusted on roots that
//! are no longer there. At most [`CAPACITY`] chains of [`MOST_BYTES`] in all, the oldest going
//! first; a chain larger than [`LARGEST`] or of more than [`MOST_CERTIFICATES`] is not kept.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rustls::pki_types::{CertificateDer, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};

/// Chains remembered per bundle.
const CAPACITY: usize = 256;

/// The largest chain remembered, and the most certificates in it: a workload's is a leaf and a
/// root or an intermediate or two, about 1 KiB. A peer with any valid certificate could pad its
/// chain with unused certificates (up to a handshake message, 64 KiB) before it proves it holds
/// the key; such a chain is verified every time, never kept.
const LARGEST: usize = 8 << 10;
const MOST_CERTIFICATES: usize = 4;

/// The bytes of all chains remembered per bundle; the oldest go first past it.
const MOST_BYTES: usize = 256 << 10;

/// What a chain was verified for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Usage {
    /// A server's chain (serverAuth), verified by a client.
    Server,
    /// A client's chain (clientAuth), verified by a server.
    Client,
}

/// The chains verified to one bundle's roots.
#[derive(Default)]
pub(crate) struct Verified {
    chains: Mutex<VecDeque<Chain>>,
    /// Verifications skipped.
    hits: AtomicU64,
}

/// Counts only: the chains' bytes are certificates, not for logs.
impl std::fmt::Debug for Verified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verified")
            .field("chains", &self.chains.lock().len())
            .field("hits", &self.hits())
            .finish()
    }
}

struct Chain {
    usage: Usage,
    digest: u64,
    /// Each certificate's length (4 bytes, big-endian) then its bytes, end-entity first.
    bytes: Box<[u8]>,
    /// Seconds since the epoch between which every certificate of the chain is valid.
    not_before: u64,
    not_after: u64,
}

impl Verified {
    /// Whether `end_entity` with `intermediates` chains to the bundle for `usage` at `now`:
    /// from a remembered verification of the same bytes if there is one valid at `now`, else
    /// by `verify`, remembered if it succeeds.
    pub(crate) fn check(
        &self,
        usage: Usage,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
        verify: impl FnOnce() -> Result<(), rustls::Error>,
    ) -> Result<(), rustls::Error> {
        let bytes = chain_bytes(end_entity, intermediates);
        let digest = digest(&bytes);
        let at = now.as_secs();
        let known = |chains: &VecDeque<Chain>| {
            chains.iter().any(|c| {
                c.usage == usage
                    && c.digest == digest
                    && *c.bytes == *bytes
                    && (c.not_before..=c.not_after).contains(&at)
            })
        };
        if known(&self.chains.lock()) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        verify()?;
        if bytes.len() > LARGEST || 1 + intermediates.len() > MOST_CERTIFICATES {
            return Ok(());
        }
        // A chain whose validity cannot be read is verified each time, never remembered.
        let Some((not_before, not_after)) = window(end_entity, intermediates) else {
            return Ok(());
        };
        let mut chains = self.chains.lock();
        // Handshakes at once with a new chain each verified it; one keeps it.
        if known(&chains) {
            return Ok(());
        }
        let mut held: usize = chains.iter().map(|c| c.bytes.len()).sum::<usize>() + bytes.len();
        while chains.len() >= CAPACITY || held > MOST_BYTES {
            let Some(oldest) = chains.pop_front() else {
                break;
            };
            held -= oldest.bytes.len();
        }
        chains.push_back(Chain {
            usage,
            digest,
            bytes,
            not_before,
            not_after,
        });
        Ok(())
    }

    /// Verifications skipped so far.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

fn chain_bytes(end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>]) -> Box<[u8]> {
    let certs = std::iter::once(end_entity).chain(intermediates);
    let mut bytes = Vec::with_capacity(certs.clone().map(|c| 4 + c.len()).sum());
    for c in certs {
        bytes.extend_from_slice(&(c.len() as u32).to_be_bytes());
        bytes.extend_from_slice(c);
    }
    bytes.into_boxed_slice()
}

fn digest(bytes: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// The latest notBefore and the earliest notAfter of the chain's certificates, in seconds since
/// the epoch; `None` if one cannot be read or is before the epoch.
fn window(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> Option<(u64, u64)> {
    let mut not_before = 0u64;
    let mut not_after = u64::MAX;
    for c in std::iter::once(end_entity).chain(intermediates) {
        let (_, cert) = X509Certificate::from_der(c).ok()?;
        let v = cert.validity();
        not_before = not_before.max(u64::try_from(v.not_before.timestamp()).ok()?);
        not_after = not_after.min(u64::try_from(v.not_after.timestamp()).ok()?);
    }
    Some((not_before, not_after))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::testkit::TestCa;

    const ID: &str = "spiffe://cluster.local/ns/default/sa/a";

    /// Checks `chain` for `usage` at `secs`, counting the verifications made in `made`; the
    /// verification succeeds as `ok` says.
    fn check(
        v: &Verified,
        usage: Usage,
        chain: &[CertificateDer<'static>],
        secs: u64,
        ok: bool,
        made: &Cell<u32>,
    ) -> Result<(), rustls::Error> {
        let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs));
        v.check(usage, &chain[0], &chain[1..], now, || {
            made.set(made.get() + 1);
            if ok {
                Ok(())
            } else {
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::BadSignature,
                ))
            }
        })
    }

    #[test]
    fn a_chain_is_taken_again_only_as_verified_same_bytes_usage_and_within_its_validity() {
        let ca = TestCa::new("root");
        let chain = ca.issue_str(ID).chain().to_vec();
        let (not_before, not_after) = window(&chain[0], &chain[1..]).expect("a validity");
        let inside = not_before + 60;
        let v = Verified::default();
        let made = Cell::new(0);

        check(&v, Usage::Server, &chain, inside, true, &made).expect("verified");
        check(&v, Usage::Server, &chain, inside + 1, true, &made).expect("remembered");
        assert_eq!(
            (made.get(), v.hits()),
            (1, 1),
            "the second one was remembered"
        );

        // The other usage, other bytes, or a time outside the window: verified again.
        check(&v, Usage::Client, &chain, inside, true, &made).expect("verified");
        assert_eq!(made.get(), 2, "a server's chain is not a client's");
        let other = ca.issue_str(ID).chain().to_vec();
        check(&v, Usage::Server, &other, inside, true, &made).expect("verified");
        assert_eq!(made.get(), 3, "another certificate of the same identity");
        let mut altered = chain.clone();
        altered.pop();
        assert!(check(&v, Usage::Server, &altered, inside, false, &made).is_err());
        assert_eq!(made.get(), 4, "the same leaf without its chain");
        for outside in [not_before - 1, not_after + 1] {
            let err = check(&v, Usage::Server, &chain, outside, false, &made);
            assert!(
                err.is_err(),
                "at {outside}, outside {not_before}..={not_after}"
            );
        }
        assert_eq!(
            made.get(),
            6,
            "not valid yet, then expired: verified, and refused"
        );
        assert_eq!(v.hits(), 1);

        // A chain padded past the most certificates kept is verified every time.
        let mut padded = chain.clone();
        padded.extend(std::iter::repeat_n(chain[1].clone(), MOST_CERTIFICATES));
        for _ in 0..2 {
            check(&v, Usage::Server, &padded, inside, true, &made).expect("verified");
        }
        assert_eq!(made.get(), 8, "a padded chain is never kept");
        made.set(6);

        // A refusal is not remembered.
        let refused = Verified::default();
        for _ in 0..2 {
            assert!(check(&refused, Usage::Server, &chain, inside, false, &made).is_err());
        }
        assert_eq!((made.get(), refused.hits()), (8, 0));
    }

    /// A root, an intermediate that expires first and a leaf that starts last: the window is
    /// the leaf's start to the intermediate's end, both ends taken.
    #[test]
    fn the_window_is_where_every_certificate_of_the_chain_is_valid() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, date_time_ymd};
        let ca = |not_before, not_after| {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.not_before = not_before;
            p.not_after = not_after;
            p
        };
        let root_key = KeyPair::generate().expect("key");
        let root_params = ca(date_time_ymd(2000, 1, 1), date_time_ymd(2090, 1, 1));
        root_params.self_signed(&root_key).expect("root");
        let root = Issuer::new(root_params, root_key);
        let mid_key = KeyPair::generate().expect("key");
        let mid_params = ca(date_time_ymd(2001, 1, 1), date_time_ymd(2031, 1, 1));
        let mid_der = mid_params
            .signed_by(&mid_key, &root)
            .expect("intermediate")
            .der()
            .clone();
        let mid = Issuer::new(mid_params, mid_key);
        let leaf_key = KeyPair::generate().expect("key");
        let mut leaf_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        leaf_params.not_before = date_time_ymd(2025, 1, 1);
        leaf_params.not_after = date_time_ymd(2035, 1, 1);
        let leaf = leaf_params.signed_by(&leaf_key, &mid).expect("leaf");
        let chain = vec![leaf.der().clone(), mid_der];
        // 2025-01-01 and 2031-01-01, midnight UTC.
        let (start, end) = (1_735_689_600, 1_924_992_000);
        assert_eq!(window(&chain[0], &chain[1..]), Some((start, end)));

        let v = Verified::default();
        let made = Cell::new(0);
        check(&v, Usage::Server, &chain, start + 1, true, &made).expect("verified");
        for (at, taken) in [
            (start, true),
            (end, true),
            (start - 1, false),
            (end + 1, false),
        ] {
            let before = made.get();
            let got = check(&v, Usage::Server, &chain, at, false, &made);
            assert_eq!(got.is_ok(), taken, "at {at}");
            assert_eq!(made.get() == before, taken, "at {at}: verified again");
        }
    }

    #[test]
    fn the_oldest_chain_goes_first_once_the_capacity_is_reached() {
        let ca = TestCa::new("root");
        let first = ca.issue_str(ID).chain().to_vec();
        let (not_before, _) = window(&first[0], &first[1..]).expect("a validity");
        let v = Verified::default();
        let made = Cell::new(0);
        check(&v, Usage::Client, &first, not_before, true, &made).expect("verified");
        // The same leaf with a different tail of intermediates is another chain: cheap to make.
        for i in 0..CAPACITY {
            let mut chain = first.clone();
            chain.push(CertificateDer::from(vec![i as u8; 1 + i / 256]));
            check(&v, Usage::Client, &chain, not_before, true, &made).expect("verified");
        }
        assert_eq!(
            v.chains.lock().len(),
            1,
            "a chain whose validity cannot be read (an intermediate that is no certificate) is not kept"
        );
        for _ in 0..CAPACITY {
            let chain = ca.issue_str(ID).chain().to_vec();
            check(&v, Usage::Client, &chain, not_before + 1, true, &made).expect("verified");
        }
        assert_eq!(v.chains.lock().len(), CAPACITY);
        let before = made.get();
        check(&v, Usage::Client, &first, not_before + 1, true, &made).expect("verified");
        assert_eq!(
            made.get(),
            before + 1,
            "the first chain was dropped for the newest"
        );
    }
}
