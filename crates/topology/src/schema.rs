//! The file format: serde structs that mirror the YAML one to one.
//!
//! Public so that other sources of truth (the Kubernetes translation in `ferry-k8s`) can build a
//! [`File`] and have it checked and converted by exactly the rules a hand-written file gets
//! ([`crate::convert_file`]).
//!
//! Everything here is syntax. Values that need checking against the rest of the file (names,
//! addresses, CIDRs, identities) stay strings so that [`crate::convert`] can report every problem
//! at once instead of stopping at the first. Every struct denies unknown keys: a typo is an
//! error, never a silently ignored setting.

use std::collections::BTreeMap;
use std::fmt;

use ferry_core::model::FailoverMinimum;
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// A label map (`app: echo`).
pub type Labels = BTreeMap<String, String>;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    pub trust_domain: Option<String>,
    pub clusters: Vec<ClusterSpec>,
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    pub gateways: Vec<GatewaySpec>,
    #[serde(default)]
    pub waypoints: Vec<WaypointSpec>,
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    #[serde(default)]
    pub workloads: Vec<WorkloadSpec>,
    #[serde(default)]
    pub policies: Vec<PolicySpec>,
    /// Istio's root namespace (none: `istio-system`): a peer authentication there without a
    /// selector is mesh-wide, and the policy istiod derives from STRICT lives there.
    pub root_namespace: Option<String>,
    /// Istio's `PeerAuthentication`s, oldest first (at one level, the first wins).
    #[serde(default)]
    pub peer_authentication: Vec<PeerAuthenticationSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    pub network: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    pub cluster: String,
    pub address: Option<String>,
    #[serde(default)]
    pub locality: LocalitySpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalitySpec {
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub subzone: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySpec {
    pub name: String,
    pub cluster: String,
    pub address: String,
    pub port: Option<u16>,
    pub namespace: Option<String>,
    pub service_account: Option<String>,
}

/// What a waypoint serves.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaypointForSpec {
    #[default]
    Service,
    Workload,
    All,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaypointSpec {
    pub name: String,
    pub namespace: Option<String>,
    #[serde(rename = "for", default)]
    pub for_: WaypointForSpec,
    pub scope: Option<ScopeSpec>,
    #[serde(default)]
    pub scope_by_cluster: BTreeMap<String, ScopeSpec>,
    #[serde(default)]
    pub vips: Vec<VipSpec>,
    pub load_balancing: Option<LbSpec>,
    pub service_account: Option<String>,
    #[serde(default)]
    pub instances: Vec<InstanceSpec>,
}

/// One pod of a waypoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    pub name: String,
    pub node: String,
    /// Its address, or `addresses` (one of each family for a dual-stack instance), as a
    /// workload's.
    pub address: Option<String>,
    pub addresses: Option<Vec<String>>,
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Shutting down: no new connections, open ones kept (whatever `healthy` says).
    #[serde(default)]
    pub terminating: bool,
    #[serde(default = "one")]
    pub capacity: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipSpec {
    pub network: String,
    pub address: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    pub port: u16,
    /// Optional here only so that a missing target is reported with the other problems.
    pub target_port: Option<u16>,
    /// Instead of `target_port`: Kubernetes' named target port. Each workload serves this
    /// port on its own port of this name (its `ports`); one that has none does not serve it.
    pub target_port_name: Option<String>,
    /// The port's name, as in Kubernetes: `<protocol>[-<suffix>]` declares what it speaks
    /// when `app_protocol` does not (Istio's protocol selection).
    pub name: Option<String>,
    /// Kubernetes' `appProtocol`: `http`, `http2`, `grpc`, `kubernetes.io/h2c`, ...; it wins
    /// over the name. Any other value (`tcp`, `mysql`, a domain-prefixed name) is no HTTP.
    pub app_protocol: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    pub name: String,
    pub namespace: Option<String>,
    pub hostname: Option<String>,
    #[serde(default)]
    pub vips: Vec<VipSpec>,
    #[serde(default)]
    pub ports: Vec<PortSpec>,
    pub selector: Option<Labels>,
    /// The clusters whose workloads `selector` picks (none: every cluster). A service that
    /// exists only in some clusters (as Kubernetes objects do) is backed by those clusters'
    /// pods alone.
    pub selector_clusters: Option<Vec<String>>,
    pub scope: Option<ScopeSpec>,
    #[serde(default)]
    pub scope_by_cluster: BTreeMap<String, ScopeSpec>,
    pub waypoint: Option<String>,
    pub load_balancing: Option<LbSpec>,
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    #[serde(default)]
    pub endpoints: Vec<EndpointSpec>,
    /// HTTP routes, applied in order by the service's waypoint.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
}

/// One HTTP route of a service.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub name: String,
    /// Any of these (none: every request).
    #[serde(default, rename = "match")]
    pub matches: Vec<RouteMatchSpec>,
    /// Where the requests go; none when `redirect` is set (the two exclude each other).
    #[serde(default)]
    pub backends: Vec<BackendSpec>,
    /// Deadline for the response head, in milliseconds (none: no deadline).
    pub timeout_ms: Option<u32>,
    /// Further tries of an idempotent request without a body that failed before a response.
    #[serde(default)]
    pub retries: u32,
    /// Edits of the request sent on to the backend (after it was authorized).
    #[serde(default)]
    pub request_headers: HeaderModifierSpec,
    /// Edits of the response returned to the client.
    #[serde(default)]
    pub response_headers: HeaderModifierSpec,
    /// Answer the requests with a redirect instead of sending them to a backend.
    pub redirect: Option<RedirectSpec>,
}

/// The Gateway API's `RequestRedirect`: every field left out keeps the request's.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectSpec {
    /// `http` or `https`.
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub port: Option<u16>,
    /// The whole path becomes this.
    pub replace_full_path: Option<String>,
    /// The part of the path the route's `path_prefix` matched becomes this.
    pub replace_prefix_match: Option<String>,
    /// 301 or 302 (default 302).
    pub status: Option<u16>,
}

/// Header edits, applied as every `remove`, then every `set`, then every `add`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderModifierSpec {
    /// Name to value: replaces every value of that name.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Name to value: one more value of that name.
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    /// Names whose every value is removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// Conditions that must all hold.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteMatchSpec {
    /// Exact path.
    pub path: Option<String>,
    /// Path prefix, segment-wise.
    pub path_prefix: Option<String>,
    /// The request method, exactly: `GET`, `POST`, ...
    pub method: Option<String>,
    /// Header name to pattern (exact, `prefix*`, `*suffix`, `*`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Query parameter name to value, exact: the request's query is percent-decoded, these
    /// are compared as written (the first value of a repeated parameter).
    #[serde(default)]
    pub query: BTreeMap<String, String>,
}

/// Where a share of a route's requests goes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    /// A service name in the route's namespace, or `namespace/name`.
    pub service: String,
    pub port: Option<u16>,
    /// Endpoint labels the backend is limited to.
    #[serde(default)]
    pub subset: BTreeMap<String, String>,
    #[serde(default = "one")]
    pub weight: u32,
}

/// An endpoint given by address (typically another service's VIP).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    pub address: String,
    pub cluster: String,
    pub network: Option<String>,
    /// Service port to target port.
    #[serde(default)]
    pub ports: BTreeMap<u16, u16>,
}

/// How a workload is reached.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtocolSpec {
    #[default]
    Hbone,
    Tcp,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub name: String,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub service_account: Option<String>,
    pub node: Option<String>,
    pub cluster: Option<String>,
    pub address: Option<String>,
    pub addresses: Option<Vec<String>>,
    #[serde(default)]
    pub protocol: ProtocolSpec,
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Shutting down: no new connections, open ones kept (whatever `healthy` says).
    #[serde(default)]
    pub terminating: bool,
    #[serde(default = "one")]
    pub capacity: u32,
    #[serde(default)]
    pub labels: Labels,
    pub waypoint: Option<String>,
    /// Its node proxy captures its DNS queries (UDP and TCP port 53) and answers those for mesh
    /// names (opt-in; Istio's pod annotation `ambient.istio.io/dns-capture`).
    #[serde(default)]
    pub dns_capture: bool,
    /// Its ports by name (a pod's container ports), for services whose ports target a name.
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
    /// Services of its namespace it backs whatever their selectors (Kubernetes' manual
    /// EndpointSlices), each with its service port to target port map; a service port left
    /// out has the service's own target.
    #[serde(default)]
    pub services: BTreeMap<String, BTreeMap<u16, u16>>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionSpec {
    #[default]
    Allow,
    Deny,
    Audit,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    pub name: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub mesh: bool,
    pub selector: Option<Labels>,
    /// With a `selector`: the matching workloads of every namespace, not only the policy's own
    /// (Istio's policy with a selector in its root namespace).
    #[serde(default)]
    pub any_namespace: bool,
    /// Only the workloads of these clusters (none: of every cluster). A policy read from one
    /// Kubernetes cluster governs that cluster's workloads.
    pub clusters: Option<Vec<String>>,
    #[serde(default)]
    pub action: ActionSpec,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
}

/// One rule: Istio's Kubernetes `Rule` with `from[].source` and `to[].operation` flattened.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    #[serde(default)]
    pub from: Vec<FromSpec>,
    #[serde(default)]
    pub to: Vec<ToSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FromSpec {
    #[serde(default)]
    pub principals: Vec<String>,
    #[serde(default)]
    pub not_principals: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub not_namespaces: Vec<String>,
    #[serde(default)]
    pub ip_blocks: Vec<String>,
    #[serde(default)]
    pub not_ip_blocks: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToSpec {
    #[serde(default)]
    pub ports: Vec<PortValue>,
    #[serde(default)]
    pub not_ports: Vec<PortValue>,
    /// L7, enforced by waypoints: HTTP methods, paths and hosts (exact, `prefix*`, `*suffix`).
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub not_methods: Vec<String>,
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default)]
    pub not_paths: Vec<String>,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub not_hosts: Vec<String>,
    /// Request headers: each named header must have a value matching one of the patterns.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, Vec<String>>,
}

/// Istio's `PeerAuthentication.MutualTLS.Mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MtlsModeSpec {
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

/// One peer authentication: Istio's `PeerAuthentication`, `mtls.mode` as `mode` and
/// `portLevelMtls` as a map of port to mode.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAuthenticationSpec {
    pub name: String,
    pub namespace: Option<String>,
    /// Mesh-wide: in the root namespace, without a selector.
    #[serde(default)]
    pub mesh: bool,
    pub selector: Option<Labels>,
    #[serde(default)]
    pub mode: MtlsModeSpec,
    /// Per target port (only with a `selector`): `{9090: permissive}`.
    #[serde(default)]
    pub port_level_mtls: BTreeMap<PortValue, MtlsModeSpec>,
}

/// A healthy, serving pod of capacity 1, as a file entry that names nothing else means.
impl Default for WorkloadSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            namespace: None,
            uid: None,
            service_account: None,
            node: None,
            cluster: None,
            address: None,
            addresses: None,
            protocol: ProtocolSpec::default(),
            healthy: true,
            terminating: false,
            capacity: 1,
            labels: Labels::new(),
            waypoint: None,
            dns_capture: false,
            ports: BTreeMap::new(),
            services: BTreeMap::new(),
        }
    }
}

/// A healthy, serving instance of capacity 1, as a file entry that names nothing else means.
impl Default for InstanceSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            node: String::new(),
            address: None,
            addresses: None,
            healthy: true,
            terminating: false,
            capacity: 1,
        }
    }
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// A port in a policy: a number, or (as in Istio's Kubernetes API) a string of digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortValue(pub u16);

impl<'de> Deserialize<'de> for PortValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PortValue;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number (0-65535), as a number or a string of digits")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortValue, E> {
                u16::try_from(v)
                    .map(PortValue)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortValue, E> {
                u16::try_from(v)
                    .map(PortValue)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<PortValue, E> {
                v.trim()
                    .parse()
                    .map(PortValue)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// A service's scope: `global`, `local` or `{clusters: [..]}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScopeSpec {
    Global,
    Local,
    Clusters(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClustersForm {
    clusters: Vec<String>,
}

impl<'de> Deserialize<'de> for ScopeSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ScopeSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`global`, `local` or `{clusters: [<cluster>, ..]}`")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ScopeSpec, E> {
                match v {
                    "global" => Ok(ScopeSpec::Global),
                    "local" => Ok(ScopeSpec::Local),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ScopeSpec, A::Error> {
                let form = ClustersForm::deserialize(MapAccessDeserializer::new(map))?;
                Ok(ScopeSpec::Clusters(form.clusters))
            }
        }
        d.deserialize_any(V)
    }
}

/// Istio's `LoadBalancing.Mode`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LbModeSpec {
    Standard,
    Strict,
    Failover,
}

/// One routing preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreferSpec {
    Network,
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
}

/// Istio's `LoadBalancing.HealthPolicy`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthSpec {
    #[default]
    OnlyHealthy,
    AllowAll,
}

/// The long form of a load-balancing setting.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LbDetail {
    pub mode: LbModeSpec,
    #[serde(default)]
    pub prefer: Vec<PreferSpec>,
    #[serde(default)]
    pub health: HealthSpec,
    /// Ferry's graduated failover (mode `failover` only): `2` (usable endpoints) or `"60%"` (of
    /// the tier's capacity) a locality tier needs before it takes all of the traffic.
    #[serde(default)]
    pub min_healthy: Option<MinHealthySpec>,
}

/// A graduated-failover minimum as written: a count, or a percentage as text (`"60%"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum MinHealthySpec {
    Endpoints(u32),
    Text(String),
}

impl MinHealthySpec {
    /// The minimum this names, checked: at least 1 endpoint, or 1 to 100 percent.
    pub fn minimum(&self) -> Result<FailoverMinimum, String> {
        let min = match self {
            Self::Endpoints(n) => FailoverMinimum::Endpoints(*n),
            Self::Text(t) => {
                let p = t
                    .strip_suffix('%')
                    .and_then(|p| p.trim().parse::<u8>().ok())
                    .ok_or_else(|| {
                        format!(
                            "expected a count of endpoints or a percentage like \"60%\", found {t:?}"
                        )
                    })?;
                FailoverMinimum::Percent(p)
            }
        };
        min.check()
    }
}

/// A load-balancing setting: `prefer_close`, `standard` or the long form.
#[derive(Debug)]
pub enum LbSpec {
    PreferClose,
    Standard,
    Detail(LbDetail),
}

impl<'de> Deserialize<'de> for LbSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LbSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`prefer_close`, `standard` or `{mode: .., prefer: [..], health: ..}`")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<LbSpec, E> {
                match v {
                    "prefer_close" => Ok(LbSpec::PreferClose),
                    "standard" => Ok(LbSpec::Standard),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LbSpec, A::Error> {
                LbDetail::deserialize(MapAccessDeserializer::new(map)).map(LbSpec::Detail)
            }
        }
        d.deserialize_any(V)
    }
}
