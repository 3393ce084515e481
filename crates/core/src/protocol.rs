//! Which protocol a service port speaks, as Istio reads it, and how a waypoint sends a port's
//! HTTP requests on to its endpoints.
//!
//! Istio's explicit protocol selection: a Kubernetes Service port's `appProtocol` when it has
//! one, else its name, `<protocol>[-<suffix>]`, case ignored (`http`, `http2`, `grpc`,
//! `grpc-web`, `tcp`, ...); Kubernetes' own `kubernetes.io/h2c` (an `appProtocol`) is HTTP/2 with
//! prior knowledge. istiod writes the result into WDS's `Port.app_protocol`, which has values
//! for HTTP/1.1, HTTP/2 and gRPC only: every other protocol, `grpc-web` included, goes out as
//! `UNKNOWN`, and [`declared`] says the same, so the wire is what istiod would send.

use crate::model::AppProtocol;
use crate::route::{Class, Plan};
use crate::snapshot::Snapshot;

/// The protocol a port declares by its `appProtocol` (which wins) or its name.
pub fn declared(app_protocol: Option<&str>, port_name: Option<&str>) -> AppProtocol {
    let name = match app_protocol {
        // Kubernetes' standard names are `appProtocol` values only, matched as they are.
        Some("kubernetes.io/h2c") => return AppProtocol::Http2,
        Some(a) => a,
        None => port_name.unwrap_or(""),
    };
    let name = name.to_ascii_lowercase();
    // `grpc-web` before the prefix is cut at its hyphen: not gRPC.
    if name.starts_with("grpc-web") {
        return AppProtocol::Unknown;
    }
    match name.split('-').next().unwrap_or("") {
        "http" => AppProtocol::Http11,
        "http2" => AppProtocol::Http2,
        "grpc" => AppProtocol::Grpc,
        _ => AppProtocol::Unknown,
    }
}

/// How a waypoint sends HTTP requests on to a port's endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub enum HttpUpstream {
    /// HTTP/1.1: whatever the port declared when it is not HTTP/2.
    #[default]
    #[serde(rename = "HTTP/1.1")]
    Http1,
    /// HTTP/2 with prior knowledge (h2c inside the tunnel): `http2` and `grpc` ports.
    #[serde(rename = "HTTP/2")]
    Http2,
}

impl HttpUpstream {
    /// As HTTP writes the version: `HTTP/1.1`, `HTTP/2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http1 => "HTTP/1.1",
            Self::Http2 => "HTTP/2",
        }
    }
}

impl std::fmt::Display for HttpUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AppProtocol {
    /// How a waypoint sends this port's HTTP requests on.
    pub fn http_upstream(self) -> HttpUpstream {
        match self {
            Self::Http2 | Self::Grpc => HttpUpstream::Http2,
            Self::Unknown | Self::Http11 => HttpUpstream::Http1,
        }
    }
}

/// How a waypoint sends on the requests of `plan`: as the port of the service it reached
/// declares. A workload addressed directly, or a port its service does not list, gets HTTP/1.1.
pub fn http_upstream(snap: &Snapshot, plan: &Plan) -> HttpUpstream {
    let Class::Service { service, port } = &plan.class else {
        return HttpUpstream::Http1;
    };
    snap.service(service)
        .and_then(|s| s.port(*port))
        .map_or(HttpUpstream::Http1, |p| p.app_protocol.http_upstream())
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
