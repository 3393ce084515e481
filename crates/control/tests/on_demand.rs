//! On-demand subscriptions, over real TLS against `ferry control` as it runs (the watched file):
//! a node proxy that names what it wants gets only that, later subscriptions add to it, an
//! unsubscribed name stops its updates, an edit elsewhere in the mesh sends it nothing, a name
//! that finds nothing is answered as removed (as istiod answers it), and it gets the workloads
//! on its own node; a wildcard stream beside it still gets everything.

use std::collections::BTreeSet;
use std::time::Duration;

use ferry_api::ADDRESS_TYPE;
use ferry_control::testing::control::Control;
use ferry_control::testing::generated_topology;
use ferry_control::testing::sim::{Received, Sim, SimConfig};
use tokio::time::Instant;

/// 200 pods (pod `i` on node `i % 100`, in cluster east when `i` is even), 10 services
/// (service `svcK` selects the pods with `i % 10 == K`; svc0's VIP is net-east/10.200.0.1).
fn mesh() -> String {
    generated_topology(200, 10, 0)
}

/// `text` with pod `i`'s capacity set to `capacity`.
fn with_capacity(text: &str, i: usize, capacity: u32) -> String {
    let entry = format!("{{name: pod{i}, ");
    text.lines()
        .map(|l| {
            if l.contains(&entry) {
                l.replace("capacity: 1,", &format!("capacity: {capacity},"))
            } else {
                l.to_string()
            }
        })
        .map(|l| l + "\n")
        .collect()
}

fn pod(i: usize) -> String {
    let cluster = if i.is_multiple_of(2) { "east" } else { "west" };
    format!("{cluster}//v1/Pod/default/pod{i}")
}

/// The name of svc0's address resource in what `control` serves.
fn svc0(text: &str) -> String {
    let topology = ferry_topology::parse("mesh", text).expect("the generated topology");
    let set = ferry_control::flatten::resource_set(&topology.snapshot);
    set.of_type(ADDRESS_TYPE)
        .and_then(|t| t.keys().find(|n| n.starts_with("default/svc0.")).cloned())
        .expect("svc0's resource")
}

fn config(control: &Control, node: &str) -> SimConfig {
    SimConfig {
        addr: control.listening.addr,
        bundle_pem: control.bundle().expect("the bundle"),
        token: control.token(node).expect("a token"),
        node: node.into(),
        window: None,
    }
}

/// The next address response (policy responses read and passed over), within a minute.
async fn next_address(sim: &mut Sim) -> Received {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let r = tokio::time::timeout_at(end, sim.next())
            .await
            .expect("an address response within a minute")
            .expect("the stream stays healthy")
            .expect("the stream stays open");
        if r.type_url == ADDRESS_TYPE {
            return r;
        }
    }
}

fn set(names: impl IntoIterator<Item = String>) -> BTreeSet<String> {
    names.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_demand_gets_only_what_it_names() {
    let text = mesh();
    let svc0 = svc0(&text);
    let control = Control::start("on-demand", &text).await.unwrap();
    // "outsider" has no workloads on it: what it gets is what it names.
    let mut node = Sim::connect_on_demand(&config(&control, "outsider"), &[], &[&pod(0)])
        .await
        .expect("the on-demand node connects");
    let mut everything = Sim::connect(&config(&control, "wildcard"), &[])
        .await
        .expect("the wildcard node connects");

    // By name: that one resource, nothing removed.
    let first = next_address(&mut node).await;
    assert_eq!(set(first.names), set([pod(0)]));
    assert!(first.removed_names.is_empty(), "{:?}", first.removed_names);

    // The wildcard stream gets every address resource, as before.
    let all = next_address(&mut everything).await;
    assert_eq!(all.upserts, 200 + 10, "every pod and service");

    // A later subscription by address (network/ip): pod2 is 10.0.0.2 on net-east (pod3 has the
    // same address on net-west and is not sent).
    node.subscribe(&["net-east/10.0.0.2"], &[]).await.unwrap();
    let r = next_address(&mut node).await;
    assert_eq!(set(r.names), set([pod(2)]));

    // A service by its VIP: the service and the pods backing it (pod0, held already and
    // unchanged, is not sent again).
    node.subscribe(&["net-east/10.200.0.1"], &[]).await.unwrap();
    let r = next_address(&mut node).await;
    let mut expected = set((10..200).step_by(10).map(pod));
    expected.insert(svc0.clone());
    assert_eq!(set(r.names), expected);

    // A name that finds nothing: answered as removed, as istiod answers it.
    node.subscribe(&["net-east/198.18.255.1"], &[])
        .await
        .unwrap();
    let r = next_address(&mut node).await;
    assert!(r.names.is_empty(), "{:?}", r.names);
    assert_eq!(r.removed_names, ["net-east/198.18.255.1"]);

    // Unsubscribed: pod2's updates stop. The unsubscription is followed by a subscription whose
    // answer shows the server has read both (requests are taken in order).
    node.subscribe(&["default/nothing-here"], &["net-east/10.0.0.2"])
        .await
        .unwrap();
    let r = next_address(&mut node).await;
    assert_eq!(r.removed_names, ["default/nothing-here"]);

    // An edit to pods it does not hold (pod5) or no longer asks for (pod2), and to one it holds
    // (pod0): the wildcard node sees all three, this node pod0 alone.
    let edited = with_capacity(&with_capacity(&with_capacity(&text, 5, 7), 2, 7), 0, 7);
    control.replace(&edited).unwrap();
    let mut seen = BTreeSet::new();
    while !seen.is_superset(&set([pod(0), pod(2), pod(5)])) {
        seen.extend(next_address(&mut everything).await.names);
    }
    let r = next_address(&mut node).await;
    assert_eq!(set(r.names), set([pod(0)]), "only the edited pod it holds");
    assert!(r.removed_names.is_empty(), "{:?}", r.removed_names);

    // A removal of what it holds is sent; the next edit of an unheld pod sends nothing, so the
    // answer to the next subscription is the next thing it reads.
    let without_pod10: String = edited
        .lines()
        .filter(|l| !l.contains("{name: pod10, "))
        .map(|l| format!("{l}\n"))
        .collect();
    control.replace(&without_pod10).unwrap();
    let r = next_address(&mut node).await;
    assert_eq!(r.removed_names, [pod(10)]);
    assert!(
        r.names.is_empty() || r.names == [svc0.clone()],
        "{:?}",
        r.names
    );
    control
        .replace(&with_capacity(&without_pod10, 7, 9))
        .unwrap();
    // pod7's edit reaching the wildcard node shows the server has published it.
    while !next_address(&mut everything).await.names.contains(&pod(7)) {}
    node.subscribe(&[&pod(4)], &[]).await.unwrap();
    let r = next_address(&mut node).await;
    assert_eq!(set(r.names), set([pod(4)]), "pod7's edit sent nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_demand_gets_the_workloads_on_it() {
    let text = mesh();
    let control = Control::start("on-demand-node", &text).await.unwrap();
    // node3 runs pod3 and pod103; it names nothing (ztunnel's first on-demand request).
    let mut node = Sim::connect_on_demand(&config(&control, "node3"), &[], &[])
        .await
        .expect("the node connects");
    let r = next_address(&mut node).await;
    assert_eq!(set(r.names), set([pod(3), pod(103)]));
    assert!(r.removed_names.is_empty(), "{:?}", r.removed_names);
}
