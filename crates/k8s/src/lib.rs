//! Ferry on Kubernetes: the translation of cluster objects into a Ferry mesh.
//!
//! [`ClusterObjects`] holds what one cluster's API server says (Namespaces, Nodes, Pods,
//! Services, EndpointSlices, Gateway API `Gateway`s, Istio `AuthorizationPolicy`s, the MCS
//! API's `ServiceExport`s and `ServiceImport`s); [`translate`] turns the objects of every
//! cluster into a topology file ([`ferry_topology::schema::File`]) that is checked and
//! converted by exactly the rules a hand-written topology gets, so a mesh described as
//! Kubernetes objects decides like the same mesh written as a topology file.
//! The translation is pure; the rules are on [`translate`]'s module.
//!
//! Tested here from YAML fixtures written as `kubectl get -o yaml` prints them; no live API
//! server has been run against it.

pub mod client;
pub mod crd;
pub mod enrollment;
#[cfg(feature = "testing")]
pub mod fixtures;
mod imports;
pub mod lease;
pub mod objects;
pub mod remote;
mod repair;
mod status;
#[cfg(feature = "testing")]
pub mod testing;
pub mod translate;
pub mod watch;

pub use objects::{ClusterObjects, LoadError, Note};
pub use translate::{MeshConfig, Scope, Translation, translate};
