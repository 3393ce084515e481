//! Schema to model: resolves names, fills in defaults, and checks everything that needs the
//! whole file to check, collecting every problem rather than stopping at the first.
//!
//! Sections are converted in file order (clusters, nodes, gateways, waypoints, services,
//! workloads, policies, peer authentications); each later section only refers to earlier
//! ones, so one pass suffices, except services' HTTP routes, resolved once every service is
//! known.
//! The result goes through [`SnapshotBuilder`] last, which re-checks the model's invariants.

mod chunks;
mod peer_auth;
mod places;
mod policies;
mod routes;
mod services;
mod workloads;

#[cfg(test)]
pub(crate) use chunks::PER_THREAD;
pub(crate) use chunks::threads;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::net::IpAddr;
use std::sync::Arc;

use ferry_core::identity::Identity;
use ferry_core::keyed_hash::HashMap;
use ferry_core::model::{
    Cluster, ClusterId, Gateway, GatewayRef, Locality, NetworkAddress, NetworkId, Node, NodeName,
    Policy, Service, ServiceKey, WaypointFor, Workload,
};
use ferry_core::snapshot::{Snapshot, SnapshotBuilder, SnapshotError};

use crate::error::Problem;
use crate::schema::File;

/// The trust domain when the file names none.
pub(crate) const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// The namespace of services, waypoints, workloads and policies that name none.
const DEFAULT_NAMESPACE: &str = "default";
/// How many names an "expected one of" message lists before eliding the rest.
const MAX_LISTED: usize = 8;

/// Converts a parsed file into a snapshot and its trust domain, or every problem found.
///
/// A large file's workloads are converted on every core first ([`chunks`]); when that finds
/// any problem, the file is converted again on one thread, so every problem is reported as
/// that finds it, in its order.
pub(crate) fn convert(file: &File) -> Result<(Snapshot, String), Vec<Problem>> {
    let threads = threads(file.workloads.len());
    if threads > 1
        && let Ok(done) = convert_on(file, threads)
    {
        return Ok(done);
    }
    convert_on(file, 1)
}

/// [`convert`] with the workloads on `threads` threads (with more than one, the problems are
/// not all there is to report: see [`convert`]).
fn convert_on(file: &File, threads: usize) -> Result<(Snapshot, String), Vec<Problem>> {
    let mut cx = Cx::new(file.trust_domain.as_deref());
    cx.clusters(&file.clusters);
    cx.nodes(&file.nodes);
    cx.gateways(&file.gateways);
    cx.waypoints(&file.waypoints);
    cx.services(&file.services);
    cx.routes(&file.services);
    if threads > 1 {
        if !cx.problems.is_empty() || !cx.workloads_on(&file.workloads, threads) {
            return Err(cx.problems);
        }
    } else {
        cx.workloads(&file.workloads, 0);
    }
    cx.policies(&file.policies);
    cx.peer_authentications(&file.peer_authentication, file.root_namespace.as_ref());
    if !cx.problems.is_empty() {
        return Err(cx.problems);
    }
    let Out {
        clusters,
        nodes,
        gateways,
        services,
        workloads,
        policies,
    } = cx.out;
    let mut b = SnapshotBuilder::new(1);
    for c in clusters {
        b.cluster(c);
    }
    for n in nodes {
        b.node(n);
    }
    for g in gateways {
        b.gateway(g);
    }
    for s in services {
        b.service(s);
    }
    for w in workloads {
        b.workload(w);
    }
    for p in policies {
        b.policy(p);
    }
    match b.build() {
        Ok(snapshot) => Ok((snapshot, cx.trust_domain)),
        Err(e) => Err(vec![snapshot_problem(&cx.origins, &e)]),
    }
}

/// Locates an error of the model's own checks (which the checks here should have caught first).
fn snapshot_problem(origins: &HashMap<String, String>, e: &SnapshotError) -> Problem {
    let object = match e {
        SnapshotError::DuplicateAddress { second, .. } => second.to_string(),
        SnapshotError::Duplicate { object }
        | SnapshotError::UnknownCluster { object, .. }
        | SnapshotError::UnknownNode { object, .. }
        | SnapshotError::WrongNetwork { object, .. }
        | SnapshotError::UnknownService { object, .. }
        | SnapshotError::UnknownPolicy { object, .. }
        | SnapshotError::UnresolvedGateway { object, .. }
        | SnapshotError::Identity { object, .. } => object.to_string(),
    };
    let path = origins.get(&object).cloned().unwrap_or(object);
    Problem::new(
        path,
        format!("expected a consistent mesh model, found: {e}"),
    )
}

/// The model objects built so far.
#[derive(Default)]
struct Out {
    clusters: Vec<Cluster>,
    nodes: Vec<Node>,
    gateways: Vec<Gateway>,
    services: Vec<Service>,
    workloads: Vec<Workload>,
    policies: Vec<Policy>,
}

/// A node, as workloads placed on it need it.
#[derive(Clone)]
struct NodeInfo {
    /// The node's name, one copy its workloads share.
    name: NodeName,
    cluster: ClusterId,
    /// `None` when the node's cluster is unknown (already reported).
    network: Option<NetworkId>,
    /// One copy its workloads share.
    locality: Arc<Locality>,
}

/// A waypoint, as services and workloads that use it need it.
#[derive(Clone)]
struct WaypointInfo {
    key: ServiceKey,
    serves: WaypointFor,
    path: String,
}

/// A service's selector and port map, to attach the workloads it selects.
#[derive(Clone)]
struct Selector {
    key: ServiceKey,
    namespace: String,
    labels: BTreeMap<String, String>,
    /// Only workloads of these clusters (none: of every cluster).
    clusters: Option<BTreeSet<ClusterId>>,
    ports: Vec<ferry_core::model::PortMapping>,
    /// Ports whose target is each workload's own port of this name.
    named: Vec<(u16, String)>,
}

/// A service's ports, for workloads that back it by name (`WorkloadSpec::services`): each
/// port and, if it targets a name, that name.
type ServicePorts = Vec<(u16, Option<String>)>;

/// Conversion state: what is declared so far, the problems found, and the output.
struct Cx {
    problems: Vec<Problem>,
    trust_domain: String,
    /// A valid trust domain to check other identity parts with, whatever the file says.
    check_domain: String,
    /// Cluster name to network.
    clusters: BTreeMap<String, NetworkId>,
    nodes: BTreeMap<String, NodeInfo>,
    /// Network to the gateway serving it, and where that gateway was declared.
    gateways: BTreeMap<NetworkId, (GatewayRef, String)>,
    /// `(namespace, name)` of each waypoint.
    waypoints: BTreeMap<(String, String), WaypointInfo>,
    selectors: Vec<Selector>,
    /// Each service's ports.
    service_ports: BTreeMap<ServiceKey, ServicePorts>,
    /// Who holds each address, by where it was declared.
    addresses: HashMap<NetworkAddress, String>,
    /// Declared object (as `SnapshotError` names it, e.g. `workload <uid>`) to where it was
    /// declared: finds duplicates, and locates errors of the snapshot's own checks.
    origins: HashMap<String, String>,
    out: Out,
}

impl Cx {
    fn new(trust_domain: Option<&str>) -> Self {
        let mut cx = Self {
            problems: Vec::new(),
            trust_domain: trust_domain.unwrap_or(DEFAULT_TRUST_DOMAIN).to_string(),
            check_domain: DEFAULT_TRUST_DOMAIN.to_string(),
            clusters: BTreeMap::new(),
            nodes: BTreeMap::new(),
            gateways: BTreeMap::new(),
            waypoints: BTreeMap::new(),
            selectors: Vec::new(),
            service_ports: BTreeMap::new(),
            addresses: HashMap::default(),
            origins: HashMap::default(),
            out: Out::default(),
        };
        match Identity::new(&cx.trust_domain, DEFAULT_NAMESPACE, "default") {
            Ok(_) => cx.check_domain.clone_from(&cx.trust_domain),
            Err(e) => {
                let found = cx.trust_domain.clone();
                cx.problem(
                    "trust_domain",
                    format!("expected a valid trust domain, found {found:?} ({e})"),
                );
            }
        }
        cx
    }

    fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(path, message));
    }

    /// Records that `object` was declared at `path`, or reports that it already was.
    /// `what` names the kind of name that must be unique, `found` is that name.
    /// `what` is written out only for a problem.
    fn declare(&mut self, object: String, path: &str, what: impl Display, found: &str) -> bool {
        if let Some(first) = self.origins.get(&object) {
            let msg = format!(
                "expected a unique {what}, found {found:?} again (first declared at {first})"
            );
            self.problem(path, msg);
            false
        } else {
            self.origins.insert(object, path.to_string());
            true
        }
    }

    /// Reports an empty name.
    fn check_name(&mut self, path: &str, field: &str, value: &str) {
        if value.is_empty() {
            self.problem(
                format!("{path}.{field}"),
                "expected a non-empty name, found \"\"",
            );
        }
    }

    /// Lets [`Identity::new`] judge a namespace and, if given, a service account.
    fn check_identity(&mut self, path: &str, namespace: &str, service_account: Option<&str>) {
        let parts = [
            ("namespace", Some(namespace)),
            ("service_account", service_account),
        ];
        for (field, value) in parts {
            let Some(value) = value else { continue };
            let (ns, sa) = if field == "namespace" {
                (value, "default")
            } else {
                ("default", value)
            };
            if let Err(e) = Identity::new(&self.check_domain, ns, sa) {
                let what = field.replace('_', " ");
                self.problem(
                    format!("{path}.{field}"),
                    format!("expected a valid {what} for a SPIFFE identity, found {value:?} ({e})"),
                );
            }
        }
    }

    /// Parses an IP address (`path` is written out only for a problem).
    fn ip(&mut self, path: impl Display, text: &str) -> Option<IpAddr> {
        match text.trim().parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                self.problem(
                    path.to_string(),
                    format!("expected an IP address such as 198.18.0.1, found {text:?}"),
                );
                None
            }
        }
    }

    /// Claims `ip` on `network` for the object at `owner`; reports a second claim (at `path`,
    /// written out only then).
    fn claim(&mut self, path: impl Display, owner: &str, network: &NetworkId, ip: IpAddr) {
        let addr = NetworkAddress::new(network.clone(), ip);
        if let Some(first) = self.addresses.get(&addr) {
            let msg = format!(
                "expected an address not used elsewhere on network {network}, found {ip}, already used by {first}"
            );
            self.problem(path.to_string(), msg);
        } else {
            self.addresses.insert(addr, owner.to_string());
        }
    }

    /// The network of cluster `name`, or a problem at `path`.
    fn cluster_network(&mut self, path: &str, name: &str) -> Option<NetworkId> {
        if let Some(n) = self.clusters.get(name) {
            return Some(n.clone());
        }
        let expected = one_of("clusters", self.clusters.keys());
        self.problem(path, format!("expected {expected}, found {name:?}"));
        None
    }

    /// Is `network` the network of some cluster?
    fn check_network(&mut self, path: &str, network: &str) -> Option<NetworkId> {
        if self.clusters.values().any(|n| n.as_str() == network) {
            return Some(NetworkId::new(network));
        }
        let mut nets: Vec<&str> = self.clusters.values().map(NetworkId::as_str).collect();
        nets.sort_unstable();
        nets.dedup();
        let expected = one_of("networks", nets.iter());
        self.problem(path, format!("expected {expected}, found {network:?}"));
        None
    }
}

/// `sleep` as part of a path: `workloads[3] (sleep)`.
fn item(section: &str, index: usize, name: &str) -> String {
    if name.is_empty() {
        format!("{section}[{index}]")
    } else {
        format!("{section}[{index}] ({name})")
    }
}

/// "one of the clusters [a, b]", or a note that there are none.
fn one_of<T: Display>(what: &str, names: impl IntoIterator<Item = T>) -> String {
    let names: Vec<String> = names.into_iter().map(|n| n.to_string()).collect();
    if names.is_empty() {
        return format!("one of the declared {what} (there are none)");
    }
    let mut listed = names
        .iter()
        .take(MAX_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > MAX_LISTED {
        listed.push_str(", ..");
    }
    format!("one of the {what} [{listed}]")
}

/// The namespace, defaulted.
fn namespace(ns: Option<&String>) -> String {
    ns.map_or_else(|| DEFAULT_NAMESPACE.to_string(), Clone::clone)
}

/// Do `labels` include every label of `selector`?
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}
