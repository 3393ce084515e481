//! Ferry's topology file: a YAML description, written by hand, of a whole multi-cluster mesh.
//!
//! [`parse`] (or [`load_file`]) reads the file, checks it, and converts it into a
//! [`ferry_core::snapshot::Snapshot`]. Checking never stops at the first problem: a
//! [`TopologyError`] lists every problem found, one per line, each with its place in the file
//! and what was expected and found there:
//!
//! ```text
//! examples/x.yaml:12:5: services[2].ports[0].target_port: invalid type: string "http", expected ...
//! examples/x.yaml: workloads[3] (sleep).node: expected one of the nodes [east-1, east-2], found "east-9"
//! ```
//!
//! Syntax and type errors (found while reading the YAML, one at most) carry a line and column;
//! the semantic checks that follow (references, duplicates, addresses, identities, scopes) carry
//! the path of the offending item.
//!
//! # The format
//!
//! Keys are `snake_case` and unknown keys are errors. The top level holds `trust_domain`
//! (default `cluster.local`), `root_namespace` (Istio's, default `istio-system`) and the lists
//! `clusters`, `nodes`, `gateways` (east-west, at most one per network), `waypoints`,
//! `services`, `workloads`, `policies` and `peer_authentication`. The files in
//! `examples/` at the repository root show every feature, with comments
//! (`examples/two-clusters.yaml` is the main one). Conversion rules:
//!
//! - A workload takes its cluster, network and locality from its `node`; one that runs outside
//!   any node proxy names its `cluster` instead. Every workload on a network with an east-west
//!   gateway gets that gateway as its `network_gateway`.
//! - A workload (or waypoint instance) is `healthy` unless it says `healthy: false`;
//!   `terminating: true` marks one shutting down (no new connections, its open ones kept),
//!   whatever `healthy` says.
//! - `dns_capture: true` on a workload has its node proxy capture the pod's DNS queries (UDP and
//!   TCP port 53) and answer those for mesh names itself (`ferry_core::dns`); off by default.
//! - A service is backed by the workloads of its namespace whose labels include its
//!   `selector`, with the service's port map; and by its address `endpoints` (which may be
//!   another service's VIP: a nested service address). `selector_clusters: [..]` limits the
//!   selector to the workloads of the clusters named (a service that exists only in some
//!   clusters, as Kubernetes objects do). A workload's `services: {<name or hostname>: {80:
//!   8080}}` makes it back those services of its namespace whatever their selectors, with that
//!   port map (Kubernetes' manual EndpointSlices; a port left out has the service's target).
//! - A service port may target a name instead of a number (`target_port_name: http`, as a
//!   Kubernetes `targetPort: http`): each workload serves it on its own port of that name
//!   (`ports: {http: 8080}` on the workload, a pod's container ports), so two workloads may
//!   serve it on different ports; a workload without that name does not serve the port.
//! - A service port `{port, target_port}` may say what it speaks as a Kubernetes Service port
//!   does: `app_protocol` (`http`, `http2`, `grpc`, `kubernetes.io/h2c`, ...) or else its
//!   `name` (`<protocol>[-<suffix>]`, such as `grpc-health`), read as Istio reads them
//!   (`ferry_core::protocol::declared`). A waypoint sends the HTTP requests of an `http2` or
//!   `grpc` port on as HTTP/2, every other as HTTP/1.1.
//! - `scope` is `global`, `local` (the default: the secure choice) or `{clusters: [..]}`;
//!   `scope_by_cluster` overrides it for the endpoints of one cluster.
//! - A waypoint becomes a service on port 15008 with `waypoint_for` set, backed by its
//!   `instances` (each at its `address`, or `addresses`: one of each family for a dual-stack
//!   instance, as a workload's); its load balancing defaults to `prefer_close`. A service or workload names its
//!   waypoint as `name` (same namespace) or `namespace/name`, and the waypoint's `for` must serve
//!   it.
//! - A policy applies mesh-wide (`mesh: true`), to the workloads of its namespace matching its
//!   `selector` (of every namespace with `any_namespace: true`), or else to its namespace;
//!   `clusters: [..]` limits any of these to the workloads of the clusters named. Its rules use Istio's Kubernetes shape with `from[].source` and
//!   `to[].operation` flattened: `{from: [{principals: [..]}], to: [{ports: [..]}]}`. A rule `{}`
//!   matches everything; a policy without rules matches nothing.
//! - A peer authentication is Istio's `PeerAuthentication`: `{name, namespace, mode,
//!   selector, port_level_mtls: {9090: permissive}}`, `mode` one of `strict`, `permissive`,
//!   `disable` and `unset` (the default: inherit). Mesh-wide with `mesh: true` (or, as in
//!   Istio, in the root namespace without a selector), namespace-wide without a selector, else
//!   for the workloads of its namespace whose labels include the selector; the workload's
//!   mode wins over the namespace's, which wins over the mesh's, and a port's over its
//!   workload's. At most one mesh-wide one and one namespace-wide one per namespace; of
//!   several selecting a workload, the first listed wins (Istio's oldest); port-level modes
//!   only with a selector; no selector in the root namespace. They become what istiod sends
//!   ztunnel (`ferry_core::peer_auth`): the DENY policy
//!   `<root_namespace>/istio_converted_static_strict` (plain TCP, which has no peer identity,
//!   is refused) listed on every workload whose mode is STRICT, and for port-level exceptions
//!   `<namespace>/converted_peer_authentication_<name>`, listed after the workload's own
//!   policies. Those names are taken: a policy of the same namespace and name is an error.
//! - A service with a `waypoint` may list HTTP `routes`, tried in order by that waypoint
//!   (`ferry_core::model::HttpRoute`): `{name, match: [..], backends: [{service, port, subset,
//!   weight}], timeout_ms, retries, request_headers, response_headers}`. A match holds when
//!   every condition it names does: `path` (exact) or `path_prefix` (segment-wise), `method`
//!   (exact, one of `GET`, `HEAD`, `POST`, `PUT`, `DELETE`, `CONNECT`, `OPTIONS`, `TRACE`,
//!   `PATCH`), `headers: {name: pattern}` (exact, `prefix*`, `*suffix`, `*`) and `query:
//!   {name: value}` (exact: only the request's query is percent-decoded, `+` read as a
//!   space, and compared with the name and value as written; a repeated parameter by its first
//!   value, among the query's first 256 parameters).
//!   `request_headers` edits the request the waypoint sends on, after it authorized it (the
//!   policy judges what the client sent); `response_headers` the backend's response the
//!   client gets. Each is `{remove: [name], set: {name: value}, add: {name: value}}`,
//!   applied in that order: every `remove`, then every `set` (replaces all values of the
//!   name), then every `add` (one more value). Names
//!   are valid header names, not pseudo-headers and none of `host`, `connection`,
//!   `keep-alive`, `proxy-connection`, `transfer-encoding`, `upgrade`, `te`, `trailer`,
//!   `content-length`;
//!   values are visible ASCII, spaces and tabs (no CR, LF, NUL or bytes beyond ASCII).
//!   A route may instead `redirect: {scheme, hostname, port, replace_full_path |
//!   replace_prefix_match, status}` (the Gateway API's `RequestRedirect`), and then has no
//!   `backends` (the two exclude each other): the waypoint answers each request the policy
//!   allowed with a 301 or 302 (default 302) whose `Location` keeps what is not set of the
//!   request: its scheme (`http` at a waypoint), its `Host` without port, the port it arrived
//!   on (a set `scheme` defaults to its well-known port; 80 for http and 443 for https are
//!   left out), its path and its query. `scheme` is `http` or `https`; `hostname` a DNS name;
//!   `port` 1 to 65535; a path starts with `/` and is visible ASCII without `?` or `#`;
//!   `replace_prefix_match` replaces, segment-wise, what the route's `path_prefix` matched and
//!   needs every match to be a prefix one (a match without a path counts as `/`). A redirect
//!   is the waypoint's own answer: the route's `response_headers` do not apply to it.

mod convert;
pub mod editable;
mod error;
pub mod kept;
mod limits;
pub mod reread;
mod runs;
pub mod schema;

use std::io::Read as _;
use std::path::Path;

use ferry_core::snapshot::Snapshot;

pub use error::{Location, Problem, TopologyError};
pub use limits::Limits;

/// A converted topology file.
#[derive(Debug)]
pub struct Topology {
    /// The mesh, checked and indexed.
    pub snapshot: Snapshot,
    /// The trust domain every workload identity is in.
    pub trust_domain: String,
}

/// Parses and converts the topology in `text`, within the default [`Limits`]; `source_name`
/// names it in errors.
pub fn parse(source_name: &str, text: &str) -> Result<Topology, TopologyError> {
    parse_within(source_name, text, &Limits::default())
}

/// Parses and converts the topology in `text`. The size and the nesting depth are checked
/// against `limits` in one linear pass before the YAML parser runs (it is quadratic in the
/// nesting of flow collections), so a hostile file is refused in time linear in its size.
pub fn parse_within(
    source_name: &str,
    text: &str,
    limits: &Limits,
) -> Result<Topology, TopologyError> {
    let fail = |problems| TopologyError {
        file: source_name.to_string(),
        problems,
    };
    let file = parse_file(source_name, text, limits)?;
    let (snapshot, trust_domain) = convert::convert(&file).map_err(fail)?;
    Ok(Topology {
        snapshot,
        trust_domain,
    })
}

/// The limits checked, then the YAML parsed into the schema (nothing converted yet).
fn parse_file(
    source_name: &str,
    text: &str,
    limits: &Limits,
) -> Result<schema::File, TopologyError> {
    let fail = |problems| TopologyError {
        file: source_name.to_string(),
        problems,
    };
    limits::check(text, limits).map_err(|p| fail(vec![p]))?;
    // A large file's workloads on every core, when nothing fails (`runs`).
    if let Some(file) = runs::parse(text) {
        return Ok(file);
    }
    // Parsed without tracking where the parser is (the path costs on every value); a text that
    // does not parse is parsed again with it, to name where it failed.
    let de = serde_yaml_ng::Deserializer::from_str(text);
    if let Ok(file) = <schema::File as serde::Deserialize>::deserialize(de) {
        return Ok(file);
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| fail(vec![error::from_yaml(&e)]))
}

/// [`parse_within`]'s first step alone: the limits checked, then the YAML parsed into the schema
/// (a large file's workloads on every core), nothing converted. For the start-up measurements
/// (`crates/control/examples/reload.rs`).
#[doc(hidden)]
pub fn parse_schema(
    source_name: &str,
    text: &str,
    limits: &Limits,
) -> Result<schema::File, TopologyError> {
    parse_file(source_name, text, limits)
}

/// Checks and converts an already-built [`schema::File`] by the same rules as a parsed one;
/// `source_name` names it in errors. The Kubernetes translation (`ferry-k8s`) builds its file
/// from cluster objects and converts it here.
pub fn convert_file(source_name: &str, file: &schema::File) -> Result<Topology, TopologyError> {
    let (snapshot, trust_domain) = convert::convert(file).map_err(|problems| TopologyError {
        file: source_name.to_string(),
        problems,
    })?;
    Ok(Topology {
        snapshot,
        trust_domain,
    })
}

/// The size and nesting check alone: what [`parse_within`] runs before the YAML parser. For the
/// fuzz targets (`fuzz/`), which scan hostile text without parsing it.
#[doc(hidden)]
pub fn check_limits(text: &str, limits: &Limits) -> Result<(), Problem> {
    limits::check(text, limits)
}

/// Reads and converts the topology file at `path`, within the default [`Limits`].
pub fn load_file(path: &Path) -> Result<Topology, TopologyError> {
    load_file_within(path, &Limits::default())
}

/// Reads and converts the topology file at `path`, within `limits` (see [`read_file_within`]).
pub fn load_file_within(path: &Path, limits: &Limits) -> Result<Topology, TopologyError> {
    let text = read_file_within(path, limits)?;
    parse_within(&path.display().to_string(), &text, limits)
}

/// Reads the text of the topology file at `path`, no more than `limits.max_bytes` (and one)
/// bytes of it. A file that cannot be read, is larger or is not UTF-8 is a [`TopologyError`].
pub fn read_file_within(path: &Path, limits: &Limits) -> Result<String, TopologyError> {
    let fail = |message: String| TopologyError {
        file: path.display().to_string(),
        problems: vec![Problem::new("", message)],
    };
    let unreadable = |e: std::io::Error| {
        fail(format!(
            "expected a readable UTF-8 topology file, found an error: {e}"
        ))
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let cap = u64::try_from(limits.max_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    // Sized once from the file's length (a large file read into a growing buffer was copied
    // and page-faulted at each doubling).
    let size = file
        .metadata()
        .map_or(0, |m| m.len().min(cap))
        .try_into()
        .unwrap_or(0);
    let mut bytes = Vec::with_capacity(size);
    file.take(cap).read_to_end(&mut bytes).map_err(unreadable)?;
    if bytes.len() > limits.max_bytes {
        return Err(fail(format!(
            "expected a topology file of at most {} bytes, found more",
            limits.max_bytes
        )));
    }
    String::from_utf8(bytes)
        .map_err(|e| unreadable(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

#[cfg(test)]
mod tests {
    /// A file is read into one allocation of its size, not a buffer grown by doubling.
    #[test]
    fn a_file_is_read_into_a_buffer_of_its_size() {
        let path = std::env::temp_dir().join(format!("ferry-read-{}.yaml", std::process::id()));
        let text = "# x\n".repeat(100_003);
        std::fs::write(&path, &text).expect("written");
        let read = super::read_file_within(&path, &super::Limits::default()).expect("read");
        let _ = std::fs::remove_file(&path);
        assert_eq!(read, text);
        assert_eq!(read.capacity(), text.len());
    }
}
