//! A peer's end-entity certificate (DER) as every hop reads it after the handshake: its one
//! SPIFFE identity from the URI SANs (`ferry_tls::config::peer_identity`, which the client and
//! server verifiers share) and the origin cluster from the mesh CA's extension
//! (`ferry_tls::config::peer_cluster`, OID 2.25.7205494753481155080). Malformed input is an
//! error, never a panic.
#![no_main]

use ferry_tls::config::{peer_cluster, peer_identity};
use libfuzzer_sys::fuzz_target;
use rustls_pki_types::CertificateDer;

fuzz_target!(|data: &[u8]| {
    let chain = [CertificateDer::from(data.to_vec())];
    if let Ok(id) = peer_identity(Some(&chain), "cluster.local") {
        assert_eq!(id.trust_domain(), "cluster.local");
    }
    if let Ok(Some(cluster)) = peer_cluster(Some(&chain)) {
        assert!(!cluster.as_str().is_empty(), "a bound cluster has a name");
    }
});
