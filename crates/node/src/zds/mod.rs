//! ZDS (`istio.workload.zds`), the node agent's protocol: how a CNI node agent (Istio's, or
//! Ferry's own) hands this node's pods to the node proxy, each with its network namespace as a
//! file descriptor.
//!
//! The node proxy is the client, as ztunnel is: it connects to the agent's Unix socket
//! (SOCK_SEQPACKET, one protobuf message per packet; Istio's default is
//! `/var/run/ztunnel/ztunnel.sock`), sends `ZdsHello { version: V1 }`, then answers every
//! `WorkloadRequest` with a `WorkloadResponse` ack whose error is empty on success:
//!
//! - `add { uid, workload_info }` with one descriptor in SCM_RIGHTS: serve the pod in that
//!   namespace (a pod served already, in the same namespace, is served once; in another one, the
//!   new namespace replaces the old); Ferry's extension `ferry_uncaptured_ports` (field 10000,
//!   which Istio's agent never sends) leaves those inbound ports of the pod out of capture;
//! - `keep { uid }`, replay only: do not release the pod at the end of the replay;
//! - `del { uid }`: stop serving the pod;
//! - `snapshot_sent`: the replay is over; the agent's pods that it neither added nor kept since
//!   it connected are released.
//!
//! A malformed packet, an add without a descriptor, a request of an unknown kind (a later
//! protocol version) or one out of place gets an error ack and changes nothing. When the agent
//! goes away the node proxy keeps serving its pods and connects again with a capped backoff; the
//! agent then replays, and the replay decides for every pod the node serves (or could not serve
//! from its state file: [`crate::enrollment`], the fallback while the agent is away).
//!
//! - [`frames`]: decoding and encoding packets (pure; fuzzed);
//! - `session`: one connection's replay state (pure);
//! - `client`: the socket, the backoff and the node's actions.

mod client;
pub mod frames;
mod session;

pub(crate) use client::run;

#[cfg(test)]
mod tests;
