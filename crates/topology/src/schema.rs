//! The file format: serde structs that mirror the YAML one to one.
//!
//! Everything here is syntax. Values that need checking against the rest of the file (names,
//! addresses, CIDRs, identities) stay strings so that [`crate::convert`] can report every problem
//! at once instead of stopping at the first. Every struct denies unknown keys: a typo is an
//! error, never a silently ignored setting.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// A label map (`app: echo`).
pub(crate) type Labels = BTreeMap<String, String>;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    pub(crate) trust_domain: Option<String>,
    pub(crate) clusters: Vec<ClusterSpec>,
    #[serde(default)]
    pub(crate) nodes: Vec<NodeSpec>,
    #[serde(default)]
    pub(crate) gateways: Vec<GatewaySpec>,
    #[serde(default)]
    pub(crate) waypoints: Vec<WaypointSpec>,
    #[serde(default)]
    pub(crate) services: Vec<ServiceSpec>,
    #[serde(default)]
    pub(crate) workloads: Vec<WorkloadSpec>,
    #[serde(default)]
    pub(crate) policies: Vec<PolicySpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterSpec {
    pub(crate) name: String,
    pub(crate) network: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeSpec {
    pub(crate) name: String,
    pub(crate) cluster: String,
    pub(crate) address: Option<String>,
    #[serde(default)]
    pub(crate) locality: LocalitySpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LocalitySpec {
    #[serde(default)]
    pub(crate) region: String,
    #[serde(default)]
    pub(crate) zone: String,
    #[serde(default)]
    pub(crate) subzone: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GatewaySpec {
    pub(crate) name: String,
    pub(crate) cluster: String,
    pub(crate) address: String,
    pub(crate) port: Option<u16>,
    pub(crate) namespace: Option<String>,
    pub(crate) service_account: Option<String>,
}

/// What a waypoint serves.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WaypointForSpec {
    #[default]
    Service,
    Workload,
    All,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaypointSpec {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    #[serde(rename = "for", default)]
    pub(crate) for_: WaypointForSpec,
    pub(crate) scope: Option<ScopeSpec>,
    #[serde(default)]
    pub(crate) scope_by_cluster: BTreeMap<String, ScopeSpec>,
    #[serde(default)]
    pub(crate) vips: Vec<VipSpec>,
    pub(crate) load_balancing: Option<LbSpec>,
    pub(crate) service_account: Option<String>,
    #[serde(default)]
    pub(crate) instances: Vec<InstanceSpec>,
}

/// One pod of a waypoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InstanceSpec {
    pub(crate) name: String,
    pub(crate) node: String,
    pub(crate) address: String,
    #[serde(default = "yes")]
    pub(crate) healthy: bool,
    /// Shutting down: no new connections, open ones kept (whatever `healthy` says).
    #[serde(default)]
    pub(crate) terminating: bool,
    #[serde(default = "one")]
    pub(crate) capacity: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VipSpec {
    pub(crate) network: String,
    pub(crate) address: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PortSpec {
    pub(crate) port: u16,
    /// Optional here only so that a missing target is reported with the other problems.
    pub(crate) target_port: Option<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServiceSpec {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) hostname: Option<String>,
    #[serde(default)]
    pub(crate) vips: Vec<VipSpec>,
    #[serde(default)]
    pub(crate) ports: Vec<PortSpec>,
    pub(crate) selector: Option<Labels>,
    pub(crate) scope: Option<ScopeSpec>,
    #[serde(default)]
    pub(crate) scope_by_cluster: BTreeMap<String, ScopeSpec>,
    pub(crate) waypoint: Option<String>,
    pub(crate) load_balancing: Option<LbSpec>,
    #[serde(default)]
    pub(crate) subject_alt_names: Vec<String>,
    #[serde(default)]
    pub(crate) endpoints: Vec<EndpointSpec>,
    /// HTTP routes, applied in order by the service's waypoint.
    #[serde(default)]
    pub(crate) routes: Vec<RouteSpec>,
}

/// One HTTP route of a service.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteSpec {
    pub(crate) name: String,
    /// Any of these (none: every request).
    #[serde(default, rename = "match")]
    pub(crate) matches: Vec<RouteMatchSpec>,
    pub(crate) backends: Vec<BackendSpec>,
    /// Deadline for the response head, in milliseconds (none: no deadline).
    pub(crate) timeout_ms: Option<u32>,
    /// Further tries of an idempotent request without a body that failed before a response.
    #[serde(default)]
    pub(crate) retries: u32,
}

/// Conditions that must all hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteMatchSpec {
    /// Exact path.
    pub(crate) path: Option<String>,
    /// Path prefix, segment-wise.
    pub(crate) path_prefix: Option<String>,
    /// Header name to pattern (exact, `prefix*`, `*suffix`, `*`).
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, String>,
}

/// Where a share of a route's requests goes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackendSpec {
    /// A service name in the route's namespace, or `namespace/name`.
    pub(crate) service: String,
    pub(crate) port: Option<u16>,
    /// Endpoint labels the backend is limited to.
    #[serde(default)]
    pub(crate) subset: BTreeMap<String, String>,
    #[serde(default = "one")]
    pub(crate) weight: u32,
}

/// An endpoint given by address (typically another service's VIP).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointSpec {
    pub(crate) address: String,
    pub(crate) cluster: String,
    pub(crate) network: Option<String>,
    /// Service port to target port.
    #[serde(default)]
    pub(crate) ports: BTreeMap<u16, u16>,
}

/// How a workload is reached.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProtocolSpec {
    #[default]
    Hbone,
    Tcp,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkloadSpec {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) uid: Option<String>,
    pub(crate) service_account: Option<String>,
    pub(crate) node: Option<String>,
    pub(crate) cluster: Option<String>,
    pub(crate) address: Option<String>,
    pub(crate) addresses: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) protocol: ProtocolSpec,
    #[serde(default = "yes")]
    pub(crate) healthy: bool,
    /// Shutting down: no new connections, open ones kept (whatever `healthy` says).
    #[serde(default)]
    pub(crate) terminating: bool,
    #[serde(default = "one")]
    pub(crate) capacity: u32,
    #[serde(default)]
    pub(crate) labels: Labels,
    pub(crate) waypoint: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ActionSpec {
    #[default]
    Allow,
    Deny,
    Audit,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicySpec {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    #[serde(default)]
    pub(crate) mesh: bool,
    pub(crate) selector: Option<Labels>,
    #[serde(default)]
    pub(crate) action: ActionSpec,
    #[serde(default)]
    pub(crate) dry_run: bool,
    #[serde(default)]
    pub(crate) rules: Vec<RuleSpec>,
}

/// One rule: Istio's Kubernetes `Rule` with `from[].source` and `to[].operation` flattened.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleSpec {
    #[serde(default)]
    pub(crate) from: Vec<FromSpec>,
    #[serde(default)]
    pub(crate) to: Vec<ToSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FromSpec {
    #[serde(default)]
    pub(crate) principals: Vec<String>,
    #[serde(default)]
    pub(crate) not_principals: Vec<String>,
    #[serde(default)]
    pub(crate) namespaces: Vec<String>,
    #[serde(default)]
    pub(crate) not_namespaces: Vec<String>,
    #[serde(default)]
    pub(crate) ip_blocks: Vec<String>,
    #[serde(default)]
    pub(crate) not_ip_blocks: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToSpec {
    #[serde(default)]
    pub(crate) ports: Vec<PortValue>,
    #[serde(default)]
    pub(crate) not_ports: Vec<PortValue>,
    /// L7, enforced by waypoints: HTTP methods, paths and hosts (exact, `prefix*`, `*suffix`).
    #[serde(default)]
    pub(crate) methods: Vec<String>,
    #[serde(default)]
    pub(crate) not_methods: Vec<String>,
    #[serde(default)]
    pub(crate) paths: Vec<String>,
    #[serde(default)]
    pub(crate) not_paths: Vec<String>,
    #[serde(default)]
    pub(crate) hosts: Vec<String>,
    #[serde(default)]
    pub(crate) not_hosts: Vec<String>,
    /// Request headers: each named header must have a value matching one of the patterns.
    #[serde(default)]
    pub(crate) headers: std::collections::BTreeMap<String, Vec<String>>,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// A port in a policy: a number, or (as in Istio's Kubernetes API) a string of digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PortValue(pub(crate) u16);

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
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ScopeSpec {
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
pub(crate) enum LbModeSpec {
    Standard,
    Strict,
    Failover,
}

/// One routing preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PreferSpec {
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
pub(crate) enum HealthSpec {
    #[default]
    OnlyHealthy,
    AllowAll,
}

/// The long form of a load-balancing setting.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LbDetail {
    pub(crate) mode: LbModeSpec,
    #[serde(default)]
    pub(crate) prefer: Vec<PreferSpec>,
    #[serde(default)]
    pub(crate) health: HealthSpec,
}

/// A load-balancing setting: `prefer_close`, `standard` or the long form.
#[derive(Debug)]
pub(crate) enum LbSpec {
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
