//! Node credentials: a bootstrap token per node, derived from a secret only `ferry control` holds.
//!
//! `token = "ferry-node.v1." + node name + "." + hex(HMAC-SHA256(secret, "ferry-node.v1." + node))`
//!
//! The control plane can check a token without storing one per node, and issue one for a new
//! node (`ferry control token --node NAME`). A token proves which node a caller is; the CA then
//! signs only identities of workloads scheduled on that node. Rotating the secret revokes every
//! token at once.

use std::fmt;
use std::path::Path;

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use ferry_core::model::NodeName;

const PREFIX: &str = "ferry-node.v1.";

/// Why a node credential is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("no node credential (expected metadata `authorization: Bearer <token>`)")]
    Missing,
    #[error("the node credential is malformed: {0}")]
    Malformed(&'static str),
    #[error("the node credential's signature does not verify")]
    BadSignature,
}

/// Issues and verifies node tokens.
pub struct NodeTokens {
    key: hmac::Key,
}

impl fmt::Debug for NodeTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NodeTokens { .. }")
    }
}

impl NodeTokens {
    pub fn from_secret(secret: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// Loads the secret from `path`, creating a random one (mode 0600) on first use.
    pub fn load_or_create(path: &Path) -> std::io::Result<Self> {
        match std::fs::read(path) {
            Ok(secret) if secret.len() >= 32 => Ok(Self::from_secret(&secret)),
            Ok(_) => Err(std::io::Error::other(format!(
                "{}: secret shorter than 32 bytes",
                path.display()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut secret = [0u8; 32];
                SystemRandom::new()
                    .fill(&mut secret)
                    .map_err(|_| std::io::Error::other("no randomness"))?;
                crate::ca::write_private(path, &secret)?;
                Ok(Self::from_secret(&secret))
            }
            Err(e) => Err(e),
        }
    }

    /// The token for `node`.
    pub fn issue(&self, node: &NodeName) -> String {
        let msg = format!("{PREFIX}{node}");
        let tag = hmac::sign(&self.key, msg.as_bytes());
        format!("{msg}.{}", hex(tag.as_ref()))
    }

    /// The node a token belongs to.
    pub fn verify(&self, token: &str) -> Result<NodeName, TokenError> {
        let rest = token
            .strip_prefix(PREFIX)
            .ok_or(TokenError::Malformed("unknown token format"))?;
        let (node, tag) = rest
            .rsplit_once('.')
            .ok_or(TokenError::Malformed("no signature"))?;
        if node.is_empty()
            || !node
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        {
            return Err(TokenError::Malformed("bad node name"));
        }
        let tag = unhex(tag).ok_or(TokenError::Malformed("signature is not hex"))?;
        hmac::verify(&self.key, format!("{PREFIX}{node}").as_bytes(), &tag)
            .map_err(|_| TokenError::BadSignature)?;
        Ok(NodeName::new(node))
    }

    /// Reads the token from a gRPC `authorization` metadata value.
    pub fn from_metadata(value: Option<&str>) -> Result<&str, TokenError> {
        let v = value.ok_or(TokenError::Missing)?;
        v.strip_prefix("Bearer ")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(TokenError::Malformed("expected `Bearer <token>`"))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_only_for_their_node_and_secret() {
        let t = NodeTokens::from_secret(&[7; 32]);
        let tok = t.issue(&"east-1".into());
        assert_eq!(t.verify(&tok).unwrap(), NodeName::new("east-1"));
        let forged = tok.replace("east-1", "east-2");
        assert_eq!(t.verify(&forged), Err(TokenError::BadSignature));
        assert_eq!(
            NodeTokens::from_secret(&[8; 32]).verify(&tok),
            Err(TokenError::BadSignature)
        );
        assert!(t.verify("garbage").is_err());
        assert!(t.verify("ferry-node.v1.east-1.zz").is_err());
        assert_eq!(NodeTokens::from_metadata(None), Err(TokenError::Missing));
        assert_eq!(NodeTokens::from_metadata(Some("Bearer abc")), Ok("abc"));
        assert!(NodeTokens::from_metadata(Some("Basic abc")).is_err());
    }
}
