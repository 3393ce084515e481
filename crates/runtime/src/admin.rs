//! What every program's admin endpoint shows the same way.

use ferry_tls::certs::{CertManager, CertState};
use serde_json::json;

/// A summary of every certificate: identity, state, expiry. Never key material.
pub fn cert_summary(certs: &CertManager) -> serde_json::Value {
    let now = std::time::SystemTime::now();
    certs
        .states()
        .into_iter()
        .map(|(id, st)| match st {
            CertState::Ready(i) => json!({"identity": id.to_string(), "state": "ready",
                "expires_in_s": i.not_after.duration_since(now).map(|d| d.as_secs()).unwrap_or(0)}),
            CertState::Pending => json!({"identity": id.to_string(), "state": "pending"}),
            CertState::Failed(e) => {
                json!({"identity": id.to_string(), "state": "failed", "error": e})
            }
        })
        .collect()
}
