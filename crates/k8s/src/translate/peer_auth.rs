//! Istio `PeerAuthentication` to the topology's `peer_authentication`, which becomes what
//! istiod sends ztunnel for it (`ferry_core::peer_auth`).
//!
//! - Oldest first (`creationTimestamp`, then namespace and name), as istiod picks the oldest of
//!   a level. One without selector (or with empty `matchLabels`) in the root namespace is
//!   mesh-wide, elsewhere namespace-wide; only the oldest of each namespace is kept (a note for
//!   the others, which istiod ignores too).
//! - Every cluster's PeerAuthentications govern the whole mesh (Istio expects the same
//!   configuration in every cluster); a copy in another cluster that differs from the first
//!   cluster's (in cluster ID order) is left out with a note.
//! - Left out with a note, as istiod applies none of them in ambient mode: one with a selector
//!   in the root namespace; the `portLevelMtls` of one without selector. A mode or port Ferry
//!   does not know leaves the PeerAuthentication out with a note (the API server's schema
//!   admits neither).

use std::collections::{BTreeMap, BTreeSet};

use ferry_topology::schema::{MtlsModeSpec, PeerAuthenticationSpec, PortValue};

use super::{Tx, ns_name};
use crate::crd::{MutualTls, PeerAuthentication};

impl Tx<'_> {
    pub(super) fn peer_authentications(&mut self) {
        let root = self.mesh.root_namespace.clone();
        // (creation time, namespace, name) -> the first cluster's copy and its text.
        type FirstCopy = (String, PeerAuthentication, String);
        let mut copies: BTreeMap<(Option<_>, String, String), FirstCopy> = BTreeMap::new();
        for c in self.clusters.clone() {
            for pa in &c.peer_authentications {
                let (ns, name) = ns_name(&pa.metadata);
                let text = format!("{:?}", pa.spec);
                let object = format!("PeerAuthentication {ns}/{name}");
                let when = pa.metadata.creation_timestamp.clone();
                // Copies of one object may carry other timestamps: keyed by name first.
                let existing = copies
                    .iter()
                    .find(|((_, n, m), _)| *n == ns && *m == name)
                    .map(|(_, (first, _, t))| (first.clone(), t.clone()));
                match existing {
                    Some((first, t)) if t != text => self.note(
                        &c.cluster,
                        object,
                        format!("left out: differs from cluster {first}'s copy, which governs"),
                    ),
                    Some(_) => {}
                    None => {
                        copies.insert((when, ns, name), (c.cluster.clone(), pa.clone(), text));
                    }
                }
            }
        }
        let mut namespace_wide: BTreeSet<String> = BTreeSet::new();
        for ((_, ns, name), (cluster, pa, _)) in copies {
            let object = format!("PeerAuthentication {ns}/{name}");
            let selector = pa
                .spec
                .selector
                .as_ref()
                .map(|s| s.match_labels.clone())
                .filter(|l| !l.is_empty());
            if selector.is_some() && ns == root {
                self.note(
                    &cluster,
                    object,
                    "left out: a selector in the root namespace (istiod applies none in ambient mode)",
                );
                continue;
            }
            let mode = match mode_of(pa.spec.mtls.as_ref()) {
                Ok(m) => m,
                Err(why) => {
                    self.note(&cluster, object, format!("left out: {why}"));
                    continue;
                }
            };
            let mut port_level = BTreeMap::new();
            if selector.is_none() {
                if !pa.spec.port_level_mtls.is_empty() {
                    self.note(
                        &cluster,
                        object.clone(),
                        "portLevelMtls left out: it needs a selector (istiod ignores it too)",
                    );
                }
                if !namespace_wide.insert(ns.clone()) {
                    self.note(
                        &cluster,
                        object,
                        "left out: an older PeerAuthentication without selector decides for this namespace (the oldest wins, as in Istio)",
                    );
                    continue;
                }
            } else {
                let mut bad = None;
                for (port, m) in &pa.spec.port_level_mtls {
                    match (port.trim().parse::<u16>(), mode_of(Some(m))) {
                        (Ok(p), Ok(m)) if p != 0 => {
                            port_level.insert(PortValue(p), m);
                        }
                        (_, Err(why)) => bad = Some(why),
                        _ => bad = Some(format!("portLevelMtls port {port:?}")),
                    }
                }
                if let Some(why) = bad {
                    self.note(&cluster, object, format!("left out: {why}"));
                    continue;
                }
            }
            self.file.peer_authentication.push(PeerAuthenticationSpec {
                name,
                namespace: Some(ns),
                mesh: false,
                selector,
                mode,
                port_level_mtls: port_level,
            });
        }
        if !self.file.peer_authentication.is_empty() {
            self.file.root_namespace = Some(root);
        }
    }
}

/// The mode of `mtls` (`None`: unset).
fn mode_of(mtls: Option<&MutualTls>) -> Result<MtlsModeSpec, String> {
    match mtls.and_then(|m| m.mode.as_deref()).unwrap_or("UNSET") {
        "UNSET" => Ok(MtlsModeSpec::Unset),
        "DISABLE" => Ok(MtlsModeSpec::Disable),
        "PERMISSIVE" => Ok(MtlsModeSpec::Permissive),
        "STRICT" => Ok(MtlsModeSpec::Strict),
        other => Err(format!("mTLS mode {other:?}")),
    }
}
