//! Services, their scope, load-balancing settings and waypoint references.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::Serialize;

use super::{ClusterId, HttpRoute, NetworkAddress, NetworkId, PortMapping, ServiceKey};
use crate::identity::Identity;

/// A service port and the port its endpoints listen on. Istio's `Port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ServicePort {
    pub port: u16,
    pub target_port: u16,
    /// What the port speaks, as declared ([`crate::protocol::declared`]); `unknown` is left out
    /// of the JSON.
    #[serde(skip_serializing_if = "AppProtocol::is_unknown")]
    pub app_protocol: AppProtocol,
}

impl ServicePort {
    /// A port that declares no protocol.
    pub fn new(port: u16, target_port: u16) -> Self {
        Self {
            port,
            target_port,
            app_protocol: AppProtocol::Unknown,
        }
    }
}

/// What a service port speaks. Istio's `AppProtocol` (istiod sends `HTTP11` for `http`, `HTTP2`
/// for `http2`, `GRPC` for `grpc`, and `UNKNOWN` for anything else).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AppProtocol {
    /// Nothing declared, or a protocol the wire has no value for (TCP, TLS, `grpc-web`, ...).
    #[default]
    Unknown,
    Http11,
    Http2,
    Grpc,
}

impl AppProtocol {
    pub fn is_unknown(&self) -> bool {
        *self == Self::Unknown
    }
}

/// Istio's `LoadBalancing.Mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LbMode {
    /// Every eligible endpoint, whatever its locality.
    Standard,
    /// Only endpoints that match every routing preference; none otherwise.
    Strict,
    /// Endpoints that match the most routing preferences (in order) first.
    Failover,
}

/// Istio's `LoadBalancing.Scope`: one locality property a routing preference compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalityScope {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

/// Istio's `LoadBalancing.HealthPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthPolicy {
    OnlyHealthy,
    AllowAll,
}

/// Ferry's graduated failover (an extension of `Failover` mode): what a locality tier needs to
/// take all of the traffic. Below it, the tier takes the share it has of that minimum and the
/// rest spills to the next tier, as Envoy's priority levels do with an overprovisioning factor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailoverMinimum {
    /// This many usable endpoints (healthy, serving, capacity above 0).
    Endpoints(u32),
    /// This percentage (1 to 100) of the tier's capacity usable.
    Percent(u8),
}

impl FailoverMinimum {
    /// Checks the bounds a minimum must keep: at least one endpoint, 1 to 100 percent.
    pub fn check(self) -> Result<Self, String> {
        match self {
            Self::Endpoints(0) => {
                Err("expected a failover minimum of at least 1 endpoint, found 0".into())
            }
            Self::Percent(p) if p == 0 || p > 100 => Err(format!(
                "expected a failover minimum of 1 to 100 percent, found {p}%"
            )),
            ok => Ok(ok),
        }
    }
}

impl std::fmt::Display for FailoverMinimum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Endpoints(n) => write!(f, "{n} endpoint(s)"),
            Self::Percent(p) => write!(f, "{p}% of capacity"),
        }
    }
}

/// Istio's `LoadBalancing`, with Ferry's graduated failover.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoadBalancing {
    pub mode: LbMode,
    pub routing_preference: Vec<LocalityScope>,
    pub health_policy: HealthPolicy,
    /// Only in `Failover` mode: spill gradually instead of all at once (`None`: Istio's
    /// failover, the best tier present takes everything).
    pub failover_minimum: Option<FailoverMinimum>,
}

impl LoadBalancing {
    /// Istio's `PreferClose` traffic distribution: same network, then region, zone, subzone and
    /// node, failing over outward. Ferry's default for waypoints.
    pub fn prefer_close() -> Self {
        Self {
            mode: LbMode::Failover,
            routing_preference: vec![
                LocalityScope::Network,
                LocalityScope::Region,
                LocalityScope::Zone,
                LocalityScope::Subzone,
                LocalityScope::Node,
            ],
            health_policy: HealthPolicy::OnlyHealthy,
            failover_minimum: None,
        }
    }

    /// Every healthy endpoint, chosen by capacity alone.
    pub fn standard() -> Self {
        Self {
            mode: LbMode::Standard,
            routing_preference: Vec::new(),
            health_policy: HealthPolicy::OnlyHealthy,
            failover_minimum: None,
        }
    }
}

/// Which source clusters may reach the endpoints of one cluster's instance of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeRule {
    /// Every cluster.
    Global,
    /// Only the cluster the endpoint runs in.
    Local,
    /// Exactly these clusters (an allow-list; it need not include the endpoint's own cluster).
    Clusters(BTreeSet<ClusterId>),
}

/// Ferry's extension to Istio's `Service`: which clusters may reach the service.
///
/// The rule is looked up by the cluster of the *endpoint* (a service exported from `west` may be
/// local there but global in `east`: a non-uniform set-up), and asked whether it admits the
/// *source's* cluster. Routing never chooses an endpoint, or a waypoint endpoint, whose rule does
/// not admit the source: it fails the connection instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceScope {
    pub default: ScopeRule,
    /// Per endpoint cluster overrides of `default`.
    pub by_cluster: BTreeMap<ClusterId, ScopeRule>,
}

impl ServiceScope {
    pub fn global() -> Self {
        Self {
            default: ScopeRule::Global,
            by_cluster: BTreeMap::new(),
        }
    }

    pub fn local() -> Self {
        Self {
            default: ScopeRule::Local,
            by_cluster: BTreeMap::new(),
        }
    }

    pub fn clusters<I: IntoIterator<Item = ClusterId>>(clusters: I) -> Self {
        Self {
            default: ScopeRule::Clusters(clusters.into_iter().collect()),
            by_cluster: BTreeMap::new(),
        }
    }

    /// The rule for endpoints running in `endpoint_cluster`.
    pub(crate) fn rule_for(&self, endpoint_cluster: &ClusterId) -> &ScopeRule {
        self.by_cluster
            .get(endpoint_cluster)
            .unwrap_or(&self.default)
    }

    /// May a source in `source_cluster` reach an endpoint in `endpoint_cluster`?
    pub fn admits(&self, endpoint_cluster: &ClusterId, source_cluster: &ClusterId) -> bool {
        match self.rule_for(endpoint_cluster) {
            ScopeRule::Global => true,
            ScopeRule::Local => endpoint_cluster == source_cluster,
            ScopeRule::Clusters(set) => set.contains(source_cluster),
        }
    }
}

/// What a waypoint serves: Istio's `istio.io/waypoint-for`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaypointFor {
    Service,
    Workload,
    All,
}

impl WaypointFor {
    pub fn serves_services(self) -> bool {
        matches!(self, Self::Service | Self::All)
    }

    pub fn serves_workloads(self) -> bool {
        matches!(self, Self::Workload | Self::All)
    }
}

/// Where a waypoint or gateway is: Istio's `GatewayAddress`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GatewayDestination {
    /// A service (the waypoint's or gateway's own), load-balanced like any service.
    Service(ServiceKey),
    /// One address.
    Address(NetworkAddress),
}

/// A reference to a waypoint or east-west gateway and its HBONE port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct GatewayRef {
    pub destination: GatewayDestination,
    pub hbone_port: u16,
}

/// An endpoint of a service given by address rather than by workload: typically another
/// service's VIP (a multi-cluster service whose endpoint is a cluster's own service address).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AddressEndpoint {
    pub address: NetworkAddress,
    /// The cluster the address belongs to: scope is checked against it.
    pub cluster: ClusterId,
    pub ports: Vec<PortMapping>,
}

/// A service, with Istio's `istio.workload.Service` field meanings plus Ferry's `scope`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Service {
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    /// Virtual IPs, each on one network.
    pub vips: Vec<NetworkAddress>,
    pub ports: Vec<ServicePort>,
    /// Extra identities the service's endpoints may present.
    pub subject_alt_names: Vec<Identity>,
    pub waypoint: Option<GatewayRef>,
    /// `None`: Istio's default (every eligible endpoint, by capacity).
    pub load_balancing: Option<LoadBalancing>,
    pub scope: ServiceScope,
    /// Endpoints given by address (see [`AddressEndpoint`]), beside the workloads that back it.
    pub address_endpoints: Vec<AddressEndpoint>,
    /// `Some` when this service fronts a waypoint's instances.
    pub waypoint_for: Option<WaypointFor>,
    /// HTTP routes its waypoint applies, in order (empty: every request to the service itself).
    pub http_routes: Vec<HttpRoute>,
}

// === impl Service ===

impl Service {
    pub fn key(&self) -> ServiceKey {
        ServiceKey::new(&self.namespace, &self.hostname)
    }

    pub fn port(&self, port: u16) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.port == port)
    }

    /// The service's VIP on `network`, if it has one there.
    pub(crate) fn vip_on(&self, network: &NetworkId) -> Option<IpAddr> {
        self.vips
            .iter()
            .find(|v| &v.network == network)
            .map(|v| v.ip)
    }
}
