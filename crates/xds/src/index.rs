//! What the incremental path ([`crate::incremental`]) keeps beside the held resources
//! ([`crate::assemble::Held`]): the data alone, so that the held resources can carry it while
//! its upkeep stays in `incremental`.

use std::collections::BTreeSet;

use ferry_core::keyed_hash::HashMap;
use ferry_core::model::{ClusterId, PolicyKey, ServiceKey};

/// What the incremental path keeps beside the held resources.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Index {
    /// The version of the snapshot assembled from exactly the held resources; `None` when
    /// there is none (the next push assembles in full).
    pub(crate) synced: Option<u64>,
    /// Workloads and gateways held per cluster.
    pub(crate) cluster_members: HashMap<ClusterId, usize>,
    /// Workloads whose references were skipped, by the service or policy they name.
    pub(crate) dangling_services: HashMap<ServiceKey, BTreeSet<String>>,
    pub(crate) dangling_policies: HashMap<PolicyKey, BTreeSet<String>>,
}
