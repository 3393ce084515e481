//! What a pod's DNS query for a name means in the mesh: the pure half of the node proxy's DNS
//! proxy (`ferry_node::dns` does the I/O and the wire format).
//!
//! A name is a mesh name when some service has it as its hostname: its `cluster.local` name
//! (`<name>.<namespace>.svc.cluster.local`), or the `clusterset.local` name of a multi-cluster
//! service, which the model holds as a service of its own (the Kubernetes source makes one per
//! exported service, `ferry_k8s::translate::mcs`). Names match case-insensitively and without
//! the root's trailing dot; nothing is expanded (the stub resolver applies its search list).
//!
//! Scope decides whether the name exists for the asking pod, with the check routing uses
//! ([`crate::model::ServiceScope::admits`]): a service resolves for a source in cluster `C` when
//! the scope rule of at least one of its endpoints' clusters admits `C`. So a global service
//! that runs only in another cluster resolves (the name exists only remotely), and a local
//! service of another cluster does not: the pod gets NXDOMAIN, as it would in its own cluster,
//! where no such service exists. A service without endpoints resolves only where its default
//! rule is global (no endpoint cluster says otherwise). The answer is the service's VIPs on the
//! pod's own network (no VIP there: the name exists, with no address of that family).

use std::net::{IpAddr, SocketAddr};

use crate::model::{ScopeRule, Service, Workload};
use crate::snapshot::{Endpoint, Snapshot};

/// The TTL of the node proxy's answers, in seconds (Istio's DNS proxy answers with 30).
pub const ANSWER_TTL: u32 = 30;

/// What a name is for one source pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeshName {
    /// A mesh name that resolves for this source: its addresses on the source's network (may
    /// be empty), sorted, without duplicates.
    Resolves(Vec<IpAddr>),
    /// A mesh name that does not exist for this source (out of scope): NXDOMAIN.
    Hidden,
    /// Not a mesh name: the query goes to the pod's upstream resolver unchanged.
    Outside,
}

/// `name` (as the pod asked it: any case, with or without the trailing dot) for `source`.
pub fn lookup(snap: &Snapshot, source: &Workload, name: &str) -> MeshName {
    let name = normalize(name);
    let keys = snap.services_by_hostname(&name);
    if keys.is_empty() {
        return MeshName::Outside;
    }
    let mut found = false;
    let mut addresses = Vec::new();
    for service in keys.iter().filter_map(|k| snap.service(k)) {
        if !resolves_for(snap, service, source) {
            continue;
        }
        found = true;
        addresses.extend(
            service
                .vips
                .iter()
                .filter(|v| v.network == source.network)
                .map(|v| v.ip),
        );
    }
    if !found {
        return MeshName::Hidden;
    }
    addresses.sort_unstable();
    addresses.dedup();
    MeshName::Resolves(addresses)
}

/// A DNS server's address as an operator writes it: `IP:PORT`, or an `IP` (port 53).
pub fn server_address(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| format!("expected IP:PORT or IP, found {s:?}"))
}

/// The name in the form hostnames are kept in: lower case, no trailing dot.
fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Whether some endpoint of `service` is in scope for `source`'s cluster.
fn resolves_for(snap: &Snapshot, service: &Service, source: &Workload) -> bool {
    let endpoints = snap.endpoints(&service.key());
    if endpoints.is_empty() {
        return service.scope.default == ScopeRule::Global;
    }
    endpoints.iter().any(|e| {
        let cluster = match e {
            Endpoint::Workload(uid) => match snap.workload(uid) {
                Some(w) => &w.cluster,
                None => return false,
            },
            Endpoint::Address(a) => &a.cluster,
        };
        service.scope.admits(cluster, &source.cluster)
    })
}

#[cfg(test)]
#[path = "dns_tests.rs"]
mod tests;
