//! The interner's tests.

use super::*;

#[test]
fn another_interners_copy_is_adopted_by_content_even_where_a_dropped_one_was() {
    // The client holds its own copy of each; each round's other copies are dropped with
    // their interner, and a new one may be given the address of the one before, which the
    // table must not take for it.
    let mut mine = Interner::default();
    let mut from = Adopted::default();
    for i in 0..1_000 {
        let labels = BTreeMap::from([("app".to_string(), format!("a{i}"))]);
        let name = format!("node-{i}");
        let (my_labels, my_node) = (mine.labels(labels.clone()), mine.node(&name));
        let mut theirs = Interner::default();
        let (m, n) = (theirs.labels(labels), theirs.node(&name));
        assert!(Arc::ptr_eq(&mine.adopt_labels(&m, &mut from), &my_labels));
        assert!(std::ptr::eq(
            mine.adopt_node(&n, &mut from).as_str(),
            my_node.as_str()
        ));
    }
}

#[test]
fn equal_names_and_maps_are_one_copy() {
    let mut i = Interner::default();
    let (a, b) = (i.node("node-1"), i.node("node-1"));
    assert!(std::ptr::eq(a.as_str(), b.as_str()));
    assert_eq!(i.cluster("east").as_str(), "east");
    let labels = |v: &str| BTreeMap::from([("app".to_string(), v.to_string())]);
    let (x, y) = (i.labels(labels("a")), i.labels(labels("a")));
    assert!(Arc::ptr_eq(&x, &y));
    assert!(!Arc::ptr_eq(&x, &i.labels(labels("b"))));
}

#[test]
fn a_map_is_found_by_its_bytes_and_shared_still_once_they_are_forgotten() {
    let mut i = Interner::default();
    let wire = || vec![b"app=a".to_vec()];
    let make = |_: &[Vec<u8>]| Ok::<_, ()>(BTreeMap::from([("app".to_string(), "a".to_string())]));
    let a = i.labels_wire(&wire(), make).expect("made");
    // Found by its bytes: not made again.
    let b = i.labels_wire(&wire(), |_| Err(())).expect("found");
    assert!(Arc::ptr_eq(&a, &b));
    i.forget_wire();
    assert_eq!(i.labels.by_wire.len(), 0);
    let c = i.labels_wire(&wire(), make).expect("made");
    assert!(Arc::ptr_eq(&a, &c), "found by its content");
}

#[test]
fn bytes_are_found_only_as_the_same_entries() {
    let mut i = Interner::default();
    let labels = |v: &str| BTreeMap::from([("app".to_string(), v.to_string())]);
    let a = i
        .labels_wire(&[b"ab".to_vec()], |_| Ok::<_, ()>(labels("a")))
        .expect("made");
    // The same bytes cut into other entries, or with one more entry, are other bytes.
    for other in [
        vec![b"a".to_vec(), b"b".to_vec()],
        vec![b"ab".to_vec(), Vec::new()],
        vec![],
    ] {
        let m = i
            .labels_wire(&other, |_| Ok::<_, ()>(labels("b")))
            .expect("made");
        assert!(!Arc::ptr_eq(&a, &m), "{other:?}");
    }
    let again = i
        .labels_wire(&[b"ab".to_vec()], |_| Err(()))
        .expect("found");
    assert!(Arc::ptr_eq(&a, &again));
}

/// Two inputs with one hash are told apart by their content, by bytes and by map.
#[test]
fn one_hash_for_other_bytes_or_another_map_finds_nothing() {
    let map = |v: &str| Arc::new(BTreeMap::from([("app".to_string(), v.to_string())]));
    let mut b = ByWire::default();
    b.insert(7, &[b"ab".to_vec()], map("a"));
    assert!(b.get(7, &[b"ab".to_vec()]).is_some());
    assert!(b.get(7, &[b"a".to_vec(), b"b".to_vec()]).is_none());
    assert!(b.get(7, &[b"ac".to_vec()]).is_none());
    let mut m = Maps::default();
    m.insert(7, map("a"));
    assert!(m.find(7, &map("a")).is_some());
    assert!(m.find(7, &map("b")).is_none());
}

#[test]
fn a_map_still_held_is_found_by_its_bytes_after_a_trim() {
    let mut i = Interner::default();
    let wire = |n: usize| vec![format!("app={n}").into_bytes()];
    let make = |n: usize| {
        move |_: &[Vec<u8>]| Ok::<_, ()>(BTreeMap::from([("app".to_string(), n.to_string())]))
    };
    // Enough maps for the pool to be trimmed several times, all still held.
    let held: Vec<_> = (0..5_000)
        .map(|n| i.labels_wire(&wire(n), make(n)).expect("made"))
        .collect();
    for (n, m) in held.iter().enumerate() {
        // Found by its bytes: not made again.
        let again = i
            .labels_wire(&wire(n), |_| Err(()))
            .expect("found by its bytes");
        assert!(Arc::ptr_eq(m, &again));
    }
    // Once no longer held, a map goes with its bytes at the next trim.
    drop(held);
    for n in 5_000..15_000 {
        i.labels_wire(&wire(n), make(n)).expect("made");
    }
    assert!(i.labels.set.len() <= 1024, "{}", i.labels.set.len());
    assert!(i.labels.by_wire.len() <= 1024, "{}", i.labels.by_wire.len());
}

#[test]
fn pools_stay_bounded_as_names_and_maps_come_and_go() {
    let mut i = Interner::default();
    for n in 0..10_000 {
        i.node(&format!("node-{n}"));
        // Held by no one but the pool once returned.
        i.labels(BTreeMap::from([("app".to_string(), n.to_string())]));
    }
    assert!(i.nodes.by_text.len() < 16_384, "{}", i.nodes.by_text.len());
    assert!(i.labels.set.len() <= 1024, "{}", i.labels.set.len());
    // A map still held elsewhere survives a trim.
    let kept = i.labels(BTreeMap::from([("app".to_string(), "kept".to_string())]));
    for n in 0..5_000 {
        i.labels(BTreeMap::from([("x".to_string(), n.to_string())]));
    }
    let again = i.labels(BTreeMap::from([("app".to_string(), "kept".to_string())]));
    assert!(Arc::ptr_eq(&kept, &again));
}
