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
//! (default `cluster.local`) and the lists `clusters`, `nodes`, `gateways` (east-west, at most
//! one per network), `waypoints`, `services`, `workloads` and `policies`. The files in
//! `examples/` at the repository root show every feature, with comments
//! (`examples/two-clusters.yaml` is the main one). Conversion rules:
//!
//! - A workload takes its cluster, network and locality from its `node`; one that runs outside
//!   any node proxy names its `cluster` instead. Every workload on a network with an east-west
//!   gateway gets that gateway as its `network_gateway`.
//! - A service is backed by the workloads of its namespace whose labels include its
//!   `selector`, with the service's port map; and by its address `endpoints` (which may be
//!   another service's VIP: a nested service address).
//! - `scope` is `global`, `local` (the default: the secure choice) or `{clusters: [..]}`;
//!   `scope_by_cluster` overrides it for the endpoints of one cluster.
//! - A waypoint becomes a service on port 15008 with `waypoint_for` set, backed by its
//!   `instances`; its load balancing defaults to `prefer_close`. A service or workload names its
//!   waypoint as `name` (same namespace) or `namespace/name`, and the waypoint's `for` must serve
//!   it.
//! - A policy applies mesh-wide (`mesh: true`), to the workloads matching its `selector`, or
//!   else to its namespace. Its rules use Istio's Kubernetes shape with `from[].source` and
//!   `to[].operation` flattened: `{from: [{principals: [..]}], to: [{ports: [..]}]}`. A rule `{}`
//!   matches everything; a policy without rules matches nothing.

mod convert;
mod error;
mod schema;

use std::path::Path;

use ferry_core::snapshot::Snapshot;

pub use error::{Location, Problem, TopologyError};

/// A converted topology file.
#[derive(Debug)]
pub struct Topology {
    /// The mesh, checked and indexed.
    pub snapshot: Snapshot,
    /// The trust domain every workload identity is in.
    pub trust_domain: String,
}

/// Parses and converts the topology in `text`; `source_name` names it in errors.
pub fn parse(source_name: &str, text: &str) -> Result<Topology, TopologyError> {
    let fail = |problems| TopologyError {
        file: source_name.to_string(),
        problems,
    };
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let file: schema::File =
        serde_path_to_error::deserialize(de).map_err(|e| fail(vec![error::from_yaml(&e)]))?;
    let (snapshot, trust_domain) = convert::convert(&file).map_err(fail)?;
    Ok(Topology {
        snapshot,
        trust_domain,
    })
}

/// Reads and converts the topology file at `path`. A file that cannot be read is reported as a
/// [`TopologyError`] too.
pub fn load_file(path: &Path) -> Result<Topology, TopologyError> {
    let name = path.display().to_string();
    let fail = |message: String| TopologyError {
        file: name.clone(),
        problems: vec![Problem::new("", message)],
    };
    // Deeply nested YAML parses in quadratic time: refuse files far larger than any real mesh.
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            return Err(fail(format!(
                "expected a topology file of at most {MAX_FILE_BYTES} bytes, found {} bytes",
                m.len()
            )));
        }
        _ => {}
    }
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&name, &text),
        Err(e) => Err(fail(format!(
            "expected a readable UTF-8 topology file, found an error: {e}"
        ))),
    }
}

/// The largest topology file `load_file` reads (64 MiB: about a million workloads).
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 20;
