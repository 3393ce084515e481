//! A large file's workloads converted on every core: each thread converts a run of them, in
//! file order, against its own copy of what the sections before declared, and the runs are
//! joined in order. Only a conversion that finds nothing wrong is kept: a problem in any run, or
//! a name or address two runs both claim, and the file is converted again on one thread, which
//! reports every problem where and in the order the one-thread conversion always has.

use std::num::NonZero;

use ferry_core::keyed_hash::{HashMap, HashSet};
use std::hash::Hash;

use super::{Cx, Out};
use crate::schema::WorkloadSpec;

/// The fewest workloads a thread takes, parsing or converting: below, a thread costs more
/// than it saves.
pub(crate) const PER_THREAD: usize = 4_096;

/// How many threads take `workloads` workloads: one per core, each with at least
/// [`PER_THREAD`].
pub(crate) fn threads(workloads: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, NonZero::get);
    cores.min(workloads / PER_THREAD).max(1)
}

impl Cx {
    /// Converts `specs` (all the file's workloads) on `threads` threads into this conversion's
    /// output, in file order. `false` when any problem was found (this then holds none of the
    /// workloads): the caller converts again on one thread to report it.
    ///
    /// The names and addresses the workloads claim are checked across the runs but not kept:
    /// nothing after the workloads declares a pod or workload or claims an address.
    pub(super) fn workloads_on(&mut self, specs: &[WorkloadSpec], threads: usize) -> bool {
        let size = specs.len().div_ceil(threads.max(1)).max(1);
        let runs: Vec<Self> = std::thread::scope(|s| {
            let handles: Vec<_> = specs
                .chunks(size)
                .enumerate()
                .map(|(k, run)| {
                    let mut fork = self.fork();
                    s.spawn(move || {
                        fork.workloads(run, k * size);
                        fork
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        if runs.len() != specs.len().div_ceil(size)
            || runs.iter().any(|r| !r.problems.is_empty())
            || !disjoint(runs.iter().map(|r| &r.origins), &self.origins)
            || !disjoint(runs.iter().map(|r| &r.addresses), &self.addresses)
        {
            return false;
        }
        for run in runs {
            self.out.workloads.extend(run.out.workloads);
        }
        true
    }

    /// A conversion that starts from what this one declared, with no output and no problems.
    fn fork(&self) -> Self {
        Self {
            problems: Vec::new(),
            trust_domain: self.trust_domain.clone(),
            check_domain: self.check_domain.clone(),
            clusters: self.clusters.clone(),
            nodes: self.nodes.clone(),
            gateways: self.gateways.clone(),
            waypoints: self.waypoints.clone(),
            selectors: self.selectors.clone(),
            service_ports: self.service_ports.clone(),
            addresses: self.addresses.clone(),
            origins: self.origins.clone(),
            out: Out::default(),
        }
    }
}

/// Does no key that is not in `base` appear in two of `maps`?
fn disjoint<'a, K: Eq + Hash + 'a, V: 'a>(
    maps: impl Iterator<Item = &'a HashMap<K, V>>,
    base: &HashMap<K, V>,
) -> bool {
    let mut seen: HashSet<&K> = HashSet::default();
    for map in maps {
        for key in map.keys().filter(|k| !base.contains_key(*k)) {
            if !seen.insert(key) {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use crate::convert::{convert, convert_on};
    use crate::runs::tests::mesh;
    use crate::schema::File;

    fn file(text: &str) -> File {
        serde_yaml_ng::from_str(text).expect("the mesh parses")
    }

    #[test]
    fn workloads_converted_on_threads_equal_one_thread() {
        let f = file(&mesh(1_001));
        let one = convert_on(&f, 1).expect("the mesh converts");
        assert_eq!(one.0.workloads().count(), 1_001);
        for threads in [2, 3, 8] {
            let many = convert_on(&f, threads).expect("the mesh converts on threads");
            assert!(many == one, "{threads} threads");
        }
    }

    #[test]
    fn a_problem_in_any_run_is_reported_as_on_one_thread() {
        let text = mesh(1_001);
        let last = "name: pod1000, service_account: sa0, node: node0, address: 10.0.2.1,";
        assert!(text.contains(last));
        let cases = [
            // The address of the first pod, on its network, in the last run.
            (
                text.replacen(last, &last.replace("10.0.2.1", "10.0.0.1"), 1),
                "workloads[1000] (pod1000).address: expected an address not used elsewhere",
            ),
            // The name of a pod of the first run, in its cluster (under a uid of its own, which
            // the snapshot's checks would not find).
            (
                text.replacen(last, &last.replace("pod1000,", "pod4, uid: u1000,"), 1),
                "workloads[1000] (pod4): expected a unique namespace/name in cluster east",
            ),
            // A node no one declared.
            (
                text.replacen(last, &last.replace("node0", "node9"), 1),
                "workloads[1000] (pod1000).node: expected one of the nodes",
            ),
        ];
        for (text, expected) in cases {
            let f = file(&text);
            assert!(convert_on(&f, 3).is_err(), "{expected}");
            let one = convert_on(&f, 1).expect_err("one thread finds it");
            assert_eq!(convert(&f).expect_err("found"), one);
            assert_eq!(one.len(), 1, "{one:?}");
            let said = format!("{}: {}", one[0].path, one[0].message);
            assert!(said.starts_with(expected), "{said}");
        }
    }
}
