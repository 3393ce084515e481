//! The custom resources the translation reads, as far as it reads them: Gateway API's
//! `Gateway` (`gateway.networking.k8s.io/v1`, waypoints and east-west gateways) and
//! `HTTPRoute` (routes attached to a Service), Istio's
//! `AuthorizationPolicy` and `PeerAuthentication` (`security.istio.io/v1`).
//!
//! A `Gateway`'s fields Ferry does not use are ignored. An `AuthorizationPolicy` keeps every
//! field it does not know in `other` maps: the translation must see them, because a policy
//! Ferry cannot enforce exactly fails closed instead of being read as something weaker.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

/// Fields a struct does not know, by name.
pub type Other = BTreeMap<String, Value>;

/// A Gateway API `Gateway`.
#[derive(Clone, Debug, Deserialize)]
pub struct Gateway {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: GatewaySpec,
    #[serde(default)]
    pub status: Option<GatewayStatus>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    #[serde(default)]
    pub listeners: Vec<Listener>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Listener {
    #[serde(default)]
    pub name: String,
    pub port: u16,
    #[serde(default)]
    pub protocol: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct GatewayStatus {
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct GatewayAddress {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub value: String,
}

/// Istio's `AuthorizationPolicy`.
#[derive(Clone, Debug, Deserialize)]
pub struct AuthorizationPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PolicySpec,
    /// Set when the object did not decode: why. Such a policy is kept with its metadata,
    /// selector and action only, and fails closed.
    #[serde(skip)]
    pub invalid: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    pub selector: Option<WorkloadSelector>,
    pub action: Option<String>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// `targetRef`, `targetRefs`, `provider` and anything newer.
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Rule {
    #[serde(default)]
    pub from: Vec<From>,
    #[serde(default)]
    pub to: Vec<To>,
    #[serde(default)]
    pub when: Vec<Condition>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct From {
    #[serde(default)]
    pub source: Source,
    #[serde(flatten)]
    pub other: Other,
}

/// The parts of `Source` Ferry enforces; the rest (request principals, remote IP blocks,
/// service accounts) land in `other`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
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
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct To {
    #[serde(default)]
    pub operation: Operation,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub not_hosts: Vec<String>,
    #[serde(default)]
    pub ports: Vec<String>,
    #[serde(default)]
    pub not_ports: Vec<String>,
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub not_methods: Vec<String>,
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default)]
    pub not_paths: Vec<String>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    pub key: String,
    #[serde(default)]
    pub values: Vec<String>,
    #[serde(default)]
    pub not_values: Vec<String>,
    #[serde(flatten)]
    pub other: Other,
}

/// Istio's `PeerAuthentication`. Its fields are Istio's whole API; the API server's schema
/// (and Istio's webhook) already refused objects that do not fit it.
#[derive(Clone, Debug, Deserialize)]
pub struct PeerAuthentication {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PeerAuthenticationSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    pub selector: Option<WorkloadSelector>,
    pub mtls: Option<MutualTls>,
    /// Port (a number, as text in JSON) to its mode.
    #[serde(default)]
    pub port_level_mtls: BTreeMap<String, MutualTls>,
}

/// `mtls` and each `portLevelMtls` entry: `{mode: STRICT}`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct MutualTls {
    /// `UNSET` (the default), `DISABLE`, `PERMISSIVE` or `STRICT`.
    #[serde(default)]
    pub mode: Option<String>,
}

/// The Multi-Cluster Services API's `ServiceExport` (`multicluster.x-k8s.io/v1alpha1`): the
/// Service of the same namespace and name is exported to the cluster set.
#[derive(Clone, Debug, Deserialize)]
pub struct ServiceExport {
    #[serde(default)]
    pub metadata: ObjectMeta,
}

/// The Multi-Cluster Services API's `ServiceImport`: where an MCS controller runs, the
/// cluster set's address of an exported service in this cluster.
#[derive(Clone, Debug, Deserialize)]
pub struct ServiceImport {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ServiceImportSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ServiceImportSpec {
    #[serde(default)]
    pub ips: Vec<String>,
}

/// A Gateway API `HTTPRoute` (`gateway.networking.k8s.io/v1`), as far as it is read: attached
/// to a Service (GAMMA), it is that Service's waypoint's routes. Fields Ferry does not apply are
/// kept in `other` maps, so that a rule using one is left out rather than read as something
/// else.
#[derive(Clone, Debug, Deserialize)]
pub struct HttpRoute {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: HttpRouteSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<RouteRef>,
    #[serde(default)]
    pub rules: Vec<HttpRouteRule>,
    #[serde(flatten)]
    pub other: Other,
}

/// A `parentRef` or `backendRef`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RouteRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub port: Option<u16>,
    pub weight: Option<u32>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    #[serde(default)]
    pub matches: Vec<HttpRouteMatch>,
    #[serde(default)]
    pub backend_refs: Vec<RouteRef>,
    pub timeouts: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub filters: Vec<HttpRouteFilter>,
    #[serde(flatten)]
    pub other: Other,
}

/// One of a rule's `filters`: only the header modifiers and the redirect are read; any other
/// `type` (and any other field) leaves the rule out.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub type_: String,
    pub request_header_modifier: Option<HeaderFilter>,
    pub response_header_modifier: Option<HeaderFilter>,
    pub request_redirect: Option<RedirectFilter>,
    #[serde(flatten)]
    pub other: Other,
}

/// The Gateway API's `HTTPRequestRedirectFilter`. Numbers are read wide so that a bad one is a
/// note on the rule, not an object that fails to parse.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedirectFilter {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<i64>,
    pub status_code: Option<i64>,
    #[serde(flatten)]
    pub other: Other,
}

/// The Gateway API's `HTTPPathModifier`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub type_: String,
    pub replace_full_path: Option<String>,
    pub replace_prefix_match: Option<String>,
    #[serde(flatten)]
    pub other: Other,
}

/// The Gateway API's `HTTPHeaderFilter`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct HeaderFilter {
    #[serde(default)]
    pub set: Vec<HttpHeader>,
    #[serde(default)]
    pub add: Vec<HttpHeader>,
    #[serde(default)]
    pub remove: Vec<String>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    pub path: Option<PathMatch>,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
    pub method: Option<String>,
    #[serde(default)]
    pub query_params: Vec<QueryParamMatch>,
    #[serde(flatten)]
    pub other: Other,
}

/// An `HTTPQueryParamMatch`: `Exact` (the default) is read, `RegularExpression` is not.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct QueryParamMatch {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PathMatch {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub value: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct HeaderMatch {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub name: String,
    pub value: String,
}
