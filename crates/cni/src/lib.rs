//! Ferry's CNI side: `ferry cni`, a chained CNI plugin (spec 1.0: ADD, DEL, CHECK, VERSION)
//! that the container runtime runs for each pod, and `ferry cni agent`, the node agent that
//! holds the enrolled pods' network namespaces and hands them to the node proxy over ZDS
//! (`istio.workload.zds`), the node proxy's one enrollment protocol (Istio's CNI agent speaks
//! it too).
//!
//! ```text
//!   runtime --exec--> bridge, host-local, ..., ferry-cni --JSON line--> agent --ZDS--> node proxy
//!                                                  (plugin socket)           (SOCK_SEQPACKET,
//!                                                                             netns in SCM_RIGHTS)
//! ```
//!
//! - [`spec`]: the CNI contract (environment, configuration, results, errors), pure;
//! - [`wire`]: the plugin's questions to the agent;
//! - [`plugin`]: the plugin process;
//! - [`agent`]: the node agent.

pub mod agent;
pub mod plugin;
pub mod spec;
pub mod wire;
