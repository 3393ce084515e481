//! Peer authentications (Istio's `PeerAuthentication`) to the authorization policies istiod
//! derives from them ([`ferry_core::peer_auth`]), listed on the workloads they govern.

use std::collections::{BTreeMap, HashMap};

use ferry_core::identity::Identity;
use ferry_core::model::{MtlsMode, PeerAuthentication};
use ferry_core::peer_auth::{Conversion, DEFAULT_ROOT_NAMESPACE};

use super::{Cx, item, namespace};
use crate::schema::{MtlsModeSpec, PeerAuthenticationSpec, PortValue};

impl Cx {
    /// Checks `specs`, then adds the policies they become and lists them on every workload
    /// they govern (after the workload's own policies). `root` is the file's root namespace.
    pub(super) fn peer_authentications(
        &mut self,
        specs: &[PeerAuthenticationSpec],
        root: Option<&String>,
    ) {
        let root = root.map_or_else(|| DEFAULT_ROOT_NAMESPACE.to_string(), Clone::clone);
        if let Err(e) = Identity::new(&self.check_domain, &root, "default") {
            self.problem(
                "root_namespace",
                format!("expected a valid namespace for a SPIFFE identity, found {root:?} ({e})"),
            );
        }
        let mut converted = Vec::new();
        // Where each converted policy's peer authentication and each namespace-wide one is.
        let mut paths: HashMap<String, String> = HashMap::new();
        let mut namespace_wide: HashMap<String, String> = HashMap::new();
        for (i, spec) in specs.iter().enumerate() {
            let path = item("peer_authentication", i, &spec.name);
            if let Some(pa) = self.peer_authentication(&path, spec, &root, &mut namespace_wide) {
                let key = ferry_core::peer_auth::converted_key(&pa);
                paths.insert(key.to_string(), path);
                converted.push(pa);
            }
        }
        if converted.is_empty() {
            return;
        }
        let conversion = Conversion::new(&root, &converted);
        for p in conversion.policies() {
            let key = p.key().to_string();
            let path = paths
                .get(&key)
                .cloned()
                .unwrap_or_else(|| "peer_authentication".to_string());
            let what = "policy namespace/name (one derived from peer authentications)";
            if self.declare(format!("policy {key}"), &path, what, &key) {
                self.out.policies.push(p.clone());
            }
        }
        for w in &mut self.out.workloads {
            let keys = conversion.workload_policies(&w.namespace, &w.labels);
            w.authorization_policies.extend(keys);
        }
    }

    /// One peer authentication, checked; `None` when it has a problem.
    fn peer_authentication(
        &mut self,
        path: &str,
        spec: &PeerAuthenticationSpec,
        root: &str,
        namespace_wide: &mut HashMap<String, String>,
    ) -> Option<PeerAuthentication> {
        let before = self.problems.len();
        self.check_name(path, "name", &spec.name);
        let ns = match (spec.mesh, &spec.namespace) {
            (true, Some(n)) if n != root => {
                self.problem(
                    format!("{path}.namespace"),
                    format!(
                        "expected the root namespace {root:?} (or none) with `mesh: true`, found {n:?}"
                    ),
                );
                n.clone()
            }
            (true, _) => root.to_string(),
            (false, n) => namespace(n.as_ref()),
        };
        self.check_identity(path, &ns, None);
        let key = format!("{ns}/{}", spec.name);
        self.declare(
            format!("peer_authentication {key}"),
            path,
            "peer authentication namespace/name",
            &key,
        );
        let selector = match (&spec.selector, spec.mesh) {
            (Some(_), true) => {
                self.problem(
                    path,
                    "expected at most one of `mesh: true` and `selector`, found both",
                );
                BTreeMap::new()
            }
            (Some(labels), false) if labels.is_empty() => {
                self.problem(
                    format!("{path}.selector"),
                    "expected at least one label, found an empty map (omit `selector` for the whole namespace)",
                );
                BTreeMap::new()
            }
            (Some(_), false) if ns == root => {
                self.problem(
                    format!("{path}.selector"),
                    format!(
                        "expected no selector in the root namespace {root:?} (Istio's ambient mode applies none there), found one"
                    ),
                );
                BTreeMap::new()
            }
            (Some(labels), false) => labels.clone(),
            (None, _) => BTreeMap::new(),
        };
        if selector.is_empty() && spec.selector.is_none() {
            // One per namespace (the mesh's: one in the root namespace), or the oldest would
            // silently win.
            if let Some(first) = namespace_wide.get(&ns) {
                let what = if ns == root {
                    "one mesh-wide peer authentication"
                } else {
                    "one peer authentication without selector per namespace"
                };
                let msg = format!("expected {what}, found another in {ns:?} (first at {first})");
                self.problem(path, msg);
            } else {
                namespace_wide.insert(ns.clone(), path.to_string());
            }
        }
        let mut port_level = BTreeMap::new();
        if !spec.port_level_mtls.is_empty() && spec.selector.is_none() {
            self.problem(
                format!("{path}.port_level_mtls"),
                "expected port-level modes only with a `selector` (Istio takes them only on a workload selector), found them without",
            );
        }
        for (PortValue(port), mode) in &spec.port_level_mtls {
            if *port == 0 {
                self.problem(
                    format!("{path}.port_level_mtls.0"),
                    "expected a port from 1 to 65535, found 0",
                );
            }
            port_level.insert(*port, mode_of(*mode));
        }
        (self.problems.len() == before).then(|| PeerAuthentication {
            name: spec.name.clone(),
            namespace: ns,
            selector,
            mode: mode_of(spec.mode),
            port_level,
        })
    }
}

fn mode_of(m: MtlsModeSpec) -> MtlsMode {
    match m {
        MtlsModeSpec::Unset => MtlsMode::Unset,
        MtlsModeSpec::Disable => MtlsMode::Disable,
        MtlsModeSpec::Permissive => MtlsMode::Permissive,
        MtlsModeSpec::Strict => MtlsMode::Strict,
    }
}
