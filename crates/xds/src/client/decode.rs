//! Phase 1 of applying a response, without the state's lock: every resource decoded.
//!
//! Each resource decodes on its own, so a large push (a node's first sync: a million
//! workloads) is cut into chunks that threads on every core take in turn, each thread decoding
//! through an interner of its own (this one through the client's). As the other threads finish
//! chunks, this one gives them the client's interner's copies of the names and maps they share
//! between its own ([`convert::share`], each copy of another thread's found by its address
//! once met: [`Adopted`]), so the result holds what one thread decoding through the client's
//! interner would have: the same resources, in the same order, sharing as much.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use ferry_api::discovery::Resource;
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_core::model::Policy;
use parking_lot::Mutex;

use crate::convert::{self, Adopted, Decoded, Interner, InvalidResource};

/// A run smaller than this is not worth a thread.
const MIN_PER_THREAD: usize = 4_096;

/// A response's resources, decoded, in the response's order.
#[derive(Debug, Default)]
pub(super) struct DecodedPush {
    /// Name (a workload's own uid), version, resource.
    pub addresses: Vec<(Arc<str>, String, Decoded)>,
    pub policies: Vec<(String, String, Policy)>,
    pub rejected: Vec<InvalidResource>,
}

/// Decodes `resources`, of a response of type `type_url`, on as many threads as their number
/// and the cores allow. Each resource's body is freed once decoded, and its name and version
/// move into what it decoded to: a large push does not hold its wire form and its model at
/// once.
pub(super) fn decode(
    intern: &mut Interner,
    type_url: &str,
    mut resources: Vec<Resource>,
) -> DecodedPush {
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let threads = threads_for(resources.len(), cores);
    let decoded = decode_on(intern, type_url, &mut resources, threads);
    // The bytes maps were found by served this push; the node keeps the maps alone.
    intern.forget_wire();
    decoded
}

/// How many threads decode `resources`: one per core, each with at least [`MIN_PER_THREAD`].
fn threads_for(resources: usize, cores: usize) -> usize {
    (resources / MIN_PER_THREAD).clamp(1, cores.max(1))
}

/// Decodes `resources` on `threads` threads (this one included), [`CHUNK`] at a time.
fn decode_on(
    intern: &mut Interner,
    type_url: &str,
    resources: &mut [Resource],
    threads: usize,
) -> DecodedPush {
    decode_in_chunks(intern, type_url, resources, threads, CHUNK)
}

/// Resources a thread takes at a time: each takes the next chunk when done with one, so a
/// thread the machine gives less time to decodes less, and none waits long for another.
const CHUNK: usize = 1_024;

fn decode_in_chunks(
    intern: &mut Interner,
    type_url: &str,
    resources: &mut [Resource],
    threads: usize,
    chunk: usize,
) -> DecodedPush {
    if threads <= 1 {
        let mut out = DecodedPush::default();
        decode_run(intern, type_url, resources, &mut out);
        return out;
    }
    // Each chunk is taken by one thread (its index is handed out once): its lock is never
    // waited on.
    let chunks: Vec<Mutex<&mut [Resource]>> =
        resources.chunks_mut(chunk.max(1)).map(Mutex::new).collect();
    let next = AtomicUsize::new(0);
    // The next chunk not yet taken, decoded, with its index.
    let decode_next = |intern: &mut Interner| {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let mut run = chunks.get(i)?.lock();
        let mut out = DecodedPush::default();
        decode_run(intern, type_url, &mut run, &mut out);
        Some((i, out))
    };
    let decode_next = &decode_next;
    // Chunks by index, as this thread decoded them or gave them the client's copies.
    let mut done: Vec<(usize, DecodedPush)> = Vec::with_capacity(chunks.len());
    // What each other thread's chunks brought, adopted by the client's interner so far.
    let mut adopted: Vec<Adopted> = (1..threads).map(|_| Adopted::default()).collect();
    let theirs: Vec<Interner> = std::thread::scope(|s| {
        let (sender, decoded) = mpsc::channel::<(usize, usize, DecodedPush)>();
        let others: Vec<_> = (1..threads)
            .map(|t| {
                let sender = sender.clone();
                s.spawn(move || {
                    let mut theirs = Interner::default();
                    while let Some((i, out)) = decode_next(&mut theirs) {
                        // The applying thread receives until every sender is gone.
                        let _ = sender.send((i, t, out));
                    }
                    theirs
                })
            })
            .collect();
        drop(sender);
        let mut share = |intern: &mut Interner, (i, t, mut out): (usize, usize, DecodedPush)| {
            if let Some(from) = t.checked_sub(1).and_then(|t| adopted.get_mut(t)) {
                for (_, _, d) in &mut out.addresses {
                    convert::share(intern, from, d);
                }
            }
            (i, out)
        };
        // Between its own chunks, this thread gives the chunks the others have finished the
        // client's copies, then those they finish last.
        while let Some(mine) = decode_next(intern) {
            done.push(mine);
            while let Ok(theirs) = decoded.try_recv() {
                done.push(share(intern, theirs));
            }
        }
        for theirs in decoded {
            done.push(share(intern, theirs));
        }
        others
            .into_iter()
            // Decoding does not panic; if it did, the panic goes on as if on one thread.
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    // Each list made at its size once: a million addresses appended to a growing list were
    // copied again at each doubling, into fresh pages each time.
    let total = |len: fn(&DecodedPush) -> usize| done.iter().map(|(_, d)| len(d)).sum::<usize>();
    let mut out = DecodedPush {
        addresses: Vec::with_capacity(total(|d| d.addresses.len())),
        policies: Vec::with_capacity(total(|d| d.policies.len())),
        rejected: Vec::with_capacity(total(|d| d.rejected.len())),
    };
    for (_, mut run) in done {
        out.addresses.append(&mut run.addresses);
        out.policies.append(&mut run.policies);
        out.rejected.append(&mut run.rejected);
    }
    drop(adopted);
    drop(theirs);
    out
}

/// Decodes `run`, resources of a response of type `type_url`, into `out`; each resource's
/// body is dropped once decoded and its name and version moved out.
fn decode_run(intern: &mut Interner, type_url: &str, run: &mut [Resource], out: &mut DecodedPush) {
    for res in run {
        let any = res.resource.take();
        let name = std::mem::take(&mut res.name);
        let version = std::mem::take(&mut res.version);
        if any.as_ref().is_some_and(|a| a.type_url != type_url) {
            out.rejected.push(InvalidResource {
                name,
                reason: "resource type differs from the response's".into(),
            });
            continue;
        }
        let body = any.as_ref().map(|a| a.value.as_slice()).unwrap_or_default();
        match type_url {
            ADDRESS_TYPE => match convert::decode_address_with(intern, &name, body) {
                Ok(d) => {
                    // One copy of the name: a workload's own uid (equal to it).
                    let name = match &d {
                        Decoded::Workload(w) => w.uid.shared(),
                        _ => Arc::from(name),
                    };
                    out.addresses.push((name, version, d));
                }
                Err(e) => out.rejected.push(e),
            },
            AUTHORIZATION_TYPE => match convert::decode_authorization(&name, body) {
                Ok(p) => out.policies.push((name, version, p)),
                Err(e) => out.rejected.push(e),
            },
            other => out.rejected.push(InvalidResource {
                name,
                reason: format!("unknown type {other}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ferry_api::discovery::DeltaDiscoveryResponse;
    use ferry_core::testing::MeshBuilder;

    use super::*;
    use crate::resources::ResourceSet;

    /// 300 pods on two networks backing five services (pod `i` labelled `app: svc(i % 5)`),
    /// with two resources that do not decode, as one address response.
    fn response() -> DeltaDiscoveryResponse {
        let mut m = MeshBuilder::new();
        m.cluster("east", "net-east").cluster("west", "net-west");
        m.node("n0", "east", "r/z/s").node("n1", "west", "r/z/s");
        for s in 0..5 {
            let net = if s % 2 == 0 { "net-east" } else { "net-west" };
            m.service(
                &format!("svc{s}"),
                &[(net, &format!("198.19.0.{s}"))],
                80,
                8080,
            );
        }
        for i in 0..300 {
            let name = format!("pod{i}");
            let w = m.pod(
                &name,
                &format!("n{}", i % 2),
                &format!("198.18.{}.{}", i / 250, i % 250),
            );
            w.labels = BTreeMap::from([("app".to_string(), format!("svc{}", i % 5))]).into();
            m.backs(&name, &format!("svc{}", i % 5));
        }
        let set = ResourceSet::encode(&m.build());
        let mut resources: Vec<Resource> = set
            .of_type(ADDRESS_TYPE)
            .into_iter()
            .flat_map(|t| t.iter())
            .map(|(name, v)| Resource {
                name: name.clone(),
                version: v.version.clone(),
                resource: Some(prost_types::Any {
                    type_url: ADDRESS_TYPE.into(),
                    value: (*v.body).clone(),
                }),
                aliases: vec![],
            })
            .collect();
        resources[100].resource.as_mut().expect("a body").value = vec![0xff, 0xff];
        resources[250].resource.as_mut().expect("a body").type_url = AUTHORIZATION_TYPE.into();
        DeltaDiscoveryResponse {
            type_url: ADDRESS_TYPE.into(),
            resources,
            ..Default::default()
        }
    }

    fn workloads(p: &DecodedPush) -> Vec<&Arc<ferry_core::model::Workload>> {
        p.addresses
            .iter()
            .filter_map(|(_, _, d)| match d {
                Decoded::Workload(w) => Some(w),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_push_decoded_on_many_threads_is_what_one_thread_decodes_sharing_as_much() {
        let r = response();
        let mut resources = r.resources.clone();
        let one = decode_on(&mut Interner::default(), &r.type_url, &mut resources, 1);
        // Each resource's body was dropped once decoded, and its name moved out.
        assert!(resources.iter().all(|res| res.resource.is_none()));
        assert!(resources.iter().all(|res| res.name.is_empty()));
        let mut intern = Interner::default();
        let mut resources = r.resources.clone();
        let three = decode_in_chunks(&mut intern, &r.type_url, &mut resources, 3, 16);
        assert!(resources.iter().all(|res| res.resource.is_none()));
        // The same resources, names, versions and rejections, in the same order.
        assert_eq!(three.addresses.len(), 303);
        assert_eq!(one.addresses.len(), three.addresses.len());
        for ((n1, v1, d1), (n3, v3, d3)) in one.addresses.iter().zip(&three.addresses) {
            assert_eq!((n1, v1), (n3, v3));
            match (d1, d3) {
                (Decoded::Workload(a), Decoded::Workload(b)) => assert_eq!(a, b),
                (Decoded::Service(a), Decoded::Service(b)) => assert_eq!(a, b),
                _ => panic!("{n1}: decoded as different kinds"),
            }
        }
        assert_eq!(one.rejected, three.rejected);
        assert_eq!(three.rejected.len(), 2, "{:?}", three.rejected);
        assert!(three.rejected[0].name < three.rejected[1].name);
        // Every run's workloads hold one copy of each name and map, the client's interner's:
        // a later push decoded through it shares them too.
        let ws = workloads(&three);
        let last = r.resources.last().expect("resources");
        let again = match convert::decode_address_with(
            &mut intern,
            &last.name,
            &last.resource.as_ref().expect("a body").value,
        ) {
            Ok(Decoded::Workload(w)) => w,
            other => panic!("not a workload: {other:?}"),
        };
        for w in ws.iter().copied().chain([&again]) {
            let first = ws
                .iter()
                .find(|o| o.labels == w.labels)
                .expect("itself at least");
            assert!(w.labels.ptr_eq(&first.labels), "{}: labels copied", w.uid);
            assert!(
                w.services.ptr_eq(&first.services),
                "{}: services copied",
                w.uid
            );
            let on_network = ws.iter().find(|o| o.network == w.network).expect("itself");
            assert!(std::ptr::eq(
                w.network.as_str(),
                on_network.network.as_str()
            ));
            assert!(std::ptr::eq(
                w.cluster.as_str(),
                on_network.cluster.as_str()
            ));
            let on_node = ws.iter().find(|o| o.node == w.node).expect("itself");
            let node =
                |w: &ferry_core::model::Workload| w.node.as_ref().map(|n| n.as_str().as_ptr());
            assert_eq!(node(w), node(on_node));
        }
    }

    #[test]
    fn only_a_large_push_is_decoded_on_more_threads_than_one() {
        assert_eq!(threads_for(0, 8), 1);
        assert_eq!(threads_for(MIN_PER_THREAD * 2 - 1, 8), 1);
        assert_eq!(threads_for(MIN_PER_THREAD * 2, 8), 2);
        assert_eq!(threads_for(1_000_000, 2), 2);
        assert_eq!(threads_for(1_000_000, 0), 1);
    }
}
