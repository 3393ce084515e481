//! Kubernetes objects to a Ferry mesh: a pure function from the objects of every cluster to a
//! topology [`File`], which `ferry_topology::convert_file` then checks and converts by the
//! same rules as a hand-written file. No I/O here; the watch layer only collects objects.
//!
//! The rules, as Istio users already write them:
//! - **Clusters and places.** One cluster per [`ClusterObjects`], on its network; a `Node`'s
//!   `topology.kubernetes.io/region|zone` and `topology.istio.io/subzone` labels are its
//!   locality.
//! - **Enrollment.** A pod is in the mesh (reached over HBONE) when it or its namespace has
//!   `istio.io/dataplane-mode=ambient` (`none` on the pod opts it out) and the CNI side has
//!   marked it redirected (`ambient.istio.io/redirection: enabled`, as Istio's does); one asked
//!   for but not redirected is a note. Other pods are plain TCP workloads. Pods without an address, finished pods and host-network pods are left out.
//! - **Health** (workloads and waypoint instances alike). A pod named by an endpoint
//!   (`targetRef`) of an EndpointSlice labelled `kubernetes.io/service-name` takes its state from
//!   the endpoint's conditions, with Kubernetes' nils (`terminating` nil is false, `serving` nil
//!   is `ready`, `ready` nil is true): `terminating: true` is terminating (no new connections,
//!   open ones kept), else `serving: false` is unhealthy, else healthy. Named by several
//!   endpoints, it is terminating if any says so, else unhealthy if any is not serving. An
//!   endpoint whose `targetRef` uid is not the pod's names an earlier pod of that name and is
//!   not read. A pod no endpoint names keeps its own: `Ready` is health, a deletion timestamp
//!   is terminating. See [`endpoints`].
//! - **Manual endpoints.** A Service without a selector is backed by the addresses of its
//!   slices' endpoints that name no pod, each a plain TCP workload of the slice's cluster with
//!   the slice's ports (matched to the Service's by name) and the endpoint's state, as istiod
//!   reads them, and by the pods its endpoints name (see [`manual`]). Endpoints with no `targetRef` in a slice of a Service with a
//!   selector are left out, with a note per slice (none for the API server's own
//!   `default/kubernetes`, in every cluster).
//! - **Named target ports.** A Service port whose `targetPort` is a name is served by each pod
//!   on its own container port of that name (two pods may differ); a pod without one does not
//!   serve that port.
//! - **Waypoints.** A `Gateway` of class `istio-waypoint` is a waypoint; its
//!   `istio.io/waypoint-for` label says what it serves (`service`, the default, `workload`,
//!   `all`; `none` leaves it out); its instances are the pods labelled
//!   `gateway.networking.k8s.io/gateway-name`; its addresses are those of the Service of the
//!   same name. `istio.io/use-waypoint` (with `istio.io/use-waypoint-namespace`) on a pod or
//!   service, else on its namespace, attaches it; `none` opts out.
//! - **East-west gateways.** A `Gateway` of class `istio-east-west` in a cluster is that
//!   cluster network's gateway, at its first status address.
//! - **Scope.** `ferry.dev/scope` (annotation or label: `local`, `global` or a comma list of
//!   clusters) on a service, else Istio's `istio.io/global: "true"` label, else the mesh
//!   default ([`MeshConfig::default_scope`]).
//! - **Graduated failover.** `ferry.dev/failover-min-healthy` (annotation or label: `"2"`
//!   usable endpoints, or `"60%"` of capacity) on a Service fails it over by `PreferClose` tiers,
//!   spilling gradually once the nearer tier falls below the minimum; a bad value is a note.
//! - **Services in several clusters** (namespace sameness) are one service: the addresses of
//!   every cluster's copy; each cluster's pods back it only if that cluster's copy selects
//!   them; each cluster's scope applies to its own endpoints. Where copies disagree on ports,
//!   selector or waypoint, the copy of the first cluster in ID order wins, everywhere and in
//!   every replica, and each disagreement is a [`Note`].
//! - **The Multi-Cluster Services API.** A Service exported (a `ServiceExport` of the same
//!   namespace and name) from some clusters is also one cluster-set service
//!   `<name>.<namespace>.svc.clusterset.local`, backed by the exporting clusters' pods alone,
//!   reachable from every cluster, including those with no Service of that name, at its
//!   cluster-set address: the `ServiceImport`'s, else one allocated from
//!   [`MeshConfig::clusterset_cidr`] by a hash of its name (see [`mcs`]). Its scope is the
//!   whole cluster set unless `ferry.dev/scope` on a `ServiceExport` narrows it.
//! - **HTTP routes.** An `HTTPRoute` whose `parentRefs` name a Service gives that Service's
//!   waypoint one route per match of each rule, in the Gateway API's order of precedence, as
//!   far as Ferry can apply it exactly (see [`routes`]).
//! - **Policies** are translated with Istio's semantics (see [`policies`]); one Ferry cannot
//!   enforce exactly fails closed.
//! - **PeerAuthentications** become the policies istiod sends ztunnel for them (see
//!   [`peer_auth`]): plain TCP to a workload whose mode is STRICT is refused at its node.

mod endpoints;
pub mod incremental;
mod manual;
pub mod mcs;
mod peer_auth;
mod places;
mod pod_status;
mod pods;
mod policies;
mod routes;
mod scope;
mod services;
mod waypoints;

use std::collections::{BTreeMap, BTreeSet};

use ferry_topology::schema::{File, ScopeSpec};
use ferry_topology::{Topology, TopologyError};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::objects::{ClusterObjects, Note};

/// Mesh-wide settings the objects do not carry.
#[derive(Clone, Debug)]
pub struct MeshConfig {
    /// The trust domain of every workload identity.
    pub trust_domain: String,
    /// Istio's root namespace: a policy there without a selector applies mesh-wide, and its
    /// `topology.istio.io/network` label names the cluster's network.
    pub root_namespace: String,
    /// The scope of a service that says nothing: local (the secure choice) unless set.
    pub default_scope: Scope,
    /// Where cluster-set addresses of exported services come from when no `ServiceImport`
    /// gives one (address, prefix length). Default `240.240.0.0/16`, the range Istio
    /// allocates automatic addresses from.
    pub clusterset_cidr: (std::net::Ipv4Addr, u8),
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            trust_domain: "cluster.local".into(),
            root_namespace: "istio-system".into(),
            default_scope: Scope::Local,
            clusterset_cidr: (std::net::Ipv4Addr::new(240, 240, 0, 0), 16),
        }
    }
}

/// A service scope, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Global,
    Local,
    Clusters(Vec<String>),
}

impl Scope {
    fn spec(&self) -> ScopeSpec {
        match self {
            Self::Global => ScopeSpec::Global,
            Self::Local => ScopeSpec::Local,
            Self::Clusters(c) => ScopeSpec::Clusters(c.clone()),
        }
    }
}

/// The result: a topology file, and what was left out or decided on the way.
#[derive(Debug)]
pub struct Translation {
    pub file: File,
    pub notes: Vec<Note>,
    /// The `Conflict` condition every `ServiceExport` should carry: `(cluster, namespace,
    /// name)` to the conflict's message, or `None` for no conflict.
    pub exports: BTreeMap<(String, String, String), Option<String>>,
    /// The `ServiceImport`s Ferry keeps its allocated cluster-set addresses in: `(cluster,
    /// namespace, name)` to the import to write, or `None` to delete one it wrote that is no
    /// longer wanted. Only what differs from the objects read.
    pub imports: BTreeMap<(String, String, String), Option<mcs::ImportWrite>>,
}

impl Translation {
    /// Checks and converts the file, as a hand-written topology would be.
    pub fn topology(&self) -> Result<Topology, TopologyError> {
        ferry_topology::convert_file("kubernetes", &self.file)
    }
}

/// Translates the objects of `clusters` (in any order: they are taken in cluster ID order).
pub fn translate(mesh: &MeshConfig, clusters: &[ClusterObjects]) -> Translation {
    let refs: Vec<&ClusterObjects> = clusters.iter().collect();
    translate_with(mesh, &refs).0
}

/// [`translate`], with what a pod's translation reads kept ([`incremental`]).
fn translate_with(mesh: &MeshConfig, clusters: &[&ClusterObjects]) -> (Translation, PodContext) {
    let mut tx = Tx::new(mesh, clusters, PodContext::default());
    tx.places();
    tx.endpoints();
    tx.waypoints();
    tx.services();
    tx.pods();
    tx.clusterset();
    tx.manual_endpoints();
    tx.http_routes();
    tx.policies();
    tx.peer_authentications();
    let context = tx.context;
    let translation = Translation {
        file: tx.file,
        notes: tx.notes,
        exports: tx.exports,
        imports: tx.imports,
    };
    (translation, context)
}

/// What the translation of a pod reads besides the pod and its namespace, kept from a whole
/// translation for [`incremental`].
#[derive(Debug, Default)]
struct PodContext {
    /// `namespace/name` of each waypoint to what it serves.
    waypoints: BTreeMap<String, Serves>,
    /// Node name to the cluster that declared it.
    nodes: BTreeMap<String, String>,
    /// By cluster, what its EndpointSlices say of its pods.
    pod_states: BTreeMap<String, endpoints::SliceStates>,
    /// Pods named by a selector-less Service's slices, `(cluster, namespace, name)`: their
    /// workloads also back that Service ([`manual`]).
    manual: BTreeSet<(String, String, String)>,
}

/// What a waypoint serves, by `namespace/name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serves {
    Service,
    Workload,
    All,
}

/// Translation state.
struct Tx<'a> {
    mesh: &'a MeshConfig,
    clusters: Vec<&'a ClusterObjects>,
    notes: Vec<Note>,
    file: File,
    /// What a pod's translation reads, kept for the next edit ([`incremental`]).
    context: PodContext,
    /// Every service's copies by namespace and name, for the cluster-set services.
    copies: Vec<(String, String, Vec<services::ServiceCopy>)>,
    /// Each `ServiceExport`'s conflict, if any.
    exports: BTreeMap<(String, String, String), Option<String>>,
    /// The `ServiceImport`s to write or delete.
    imports: BTreeMap<(String, String, String), Option<mcs::ImportWrite>>,
}

impl<'a> Tx<'a> {
    /// A translation of `clusters` (taken in cluster ID order) starting from `context`.
    fn new(mesh: &'a MeshConfig, clusters: &[&'a ClusterObjects], context: PodContext) -> Self {
        let mut sorted = clusters.to_vec();
        sorted.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        Tx {
            mesh,
            clusters: sorted,
            notes: Vec::new(),
            file: File {
                trust_domain: Some(mesh.trust_domain.clone()),
                ..File::default()
            },
            context,
            copies: Vec::new(),
            exports: BTreeMap::new(),
            imports: BTreeMap::new(),
        }
    }
}

impl Tx<'_> {
    fn note(&mut self, cluster: &str, object: String, message: impl Into<String>) {
        self.notes.push(Note {
            cluster: cluster.to_string(),
            object,
            message: message.into(),
        });
    }

    /// The network the mesh file gives `cluster` (empty when it names none).
    fn network_of(&self, cluster: &str) -> String {
        self.file
            .clusters
            .iter()
            .find(|k| k.name == cluster)
            .map(|k| k.network.clone())
            .unwrap_or_default()
    }

    /// Labels of namespace `ns` in `cluster`.
    fn namespace_labels(&self, cluster: &ClusterObjects, ns: &str) -> BTreeMap<String, String> {
        cluster
            .namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(ns))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }
}

/// `namespace/name` of an object (`default` namespace when unset).
fn ns_name(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A label of an object.
fn label<'m>(meta: &'m ObjectMeta, key: &str) -> Option<&'m str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// The Service of `ns/name` in `c`, if it has no selector: its endpoints are its slices'.
fn selectorless<'c>(c: &'c ClusterObjects, ns: &str, name: &str) -> Option<&'c Service> {
    c.services.iter().find(|s| {
        let (sns, sname) = ns_name(&s.metadata);
        sns == ns
            && sname == name
            && s.spec.as_ref().is_some_and(|spec| {
                spec.selector.as_ref().is_none_or(BTreeMap::is_empty)
                    && spec.type_.as_deref() != Some("ExternalName")
            })
    })
}

/// An annotation, else a label, of an object.
fn setting<'m>(meta: &'m ObjectMeta, key: &str) -> Option<&'m str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
        .or_else(|| label(meta, key))
}
