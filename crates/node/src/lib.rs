//! `ferry node`: the per-node proxy.
//!
//! For each enrolled pod it opens listeners *inside the pod's network namespace* (outbound
//! 15001, inbound plain 15006, HBONE 15008) and installs redirect rules there; it impersonates
//! the pod's identity with a certificate from the CA; it routes with `ferry_core::route`, tunnels
//! with `ferry_hbone`, and authorizes at the destination with `ferry_core::authz`.
//!
//! # Layout
//! - `app`: configuration and the composition root (xDS, certificates, pool, ZDS, admin, drain).
//! - `state`: the node's state (`Node`, `Pod`, the open-connection count); `pods`: pod
//!   enrollment; [`zds`]: the node agent's protocol (Istio's `istio.workload.zds`), the one way
//!   pods are enrolled, each handed over with its namespace as a descriptor; `enrollment`: the
//!   served pods kept on disk, the fallback when the agent is not there to replay them;
//!   `recorded`: a pod's namespace as kept there (path and inode), opened only if still the same.
//! - `capture`: the iptables rules in each pod's namespace; `transparent`: the rules there that
//!   let the proxy connect to the app from the original client's address; both for each IP
//!   family (`family`: `iptables` and `ip -4`, `ip6tables` and `ip -6`).
//! - `outbound`, `inbound`: the two directions; a held inbound connection re-checks its own
//!   authorization on each snapshot change (`ferry_runtime::recheck`).
//! - `dns`: the DNS proxy of DNS-captured pods: mesh names answered (scope applied), other
//!   queries forwarded to the upstream resolver as they are.
//! - `admin`: readiness, config dump, certificates, metrics; `memory`: memory given back after
//!   load spikes.
//!
//! What it shares with the waypoint and the gateway (accept, network namespaces, telemetry) is
//! in `ferry_runtime`.

mod admin;
mod app;
mod capture;
mod dns;
mod enrollment;
mod family;
mod generation;
mod inbound;
mod memory;
mod outbound;
mod outlier;
mod pods;
mod recorded;
mod state;
mod transparent;
pub mod zds;

pub use app::{Config, run};
pub use memory::on_worker_park;
