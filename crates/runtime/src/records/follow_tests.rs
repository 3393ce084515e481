//! Following the ring: what a follower gets, what it misses, and what pushing costs without one.

use super::*;

fn record(id: &str, at_ms: u64) -> Record {
    Record {
        id: id.into(),
        at_ms,
        ..Record::default()
    }
}

fn id(f: Option<Followed>) -> String {
    match f {
        Some(Followed::Record(r)) => r.id.clone(),
        other => panic!("not a record: {other:?}"),
    }
}

#[tokio::test]
async fn a_follower_gets_what_is_pushed_after_it_and_the_backlog_since_what_it_asked() {
    let r = Records::new(8);
    r.push(record("a", 10));
    r.push(record("b", 20));
    let (backlog, mut f) = r.follow(Some(15));
    assert_eq!(
        backlog.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    let (none, mut g) = r.follow(None);
    assert!(none.is_empty());
    assert_eq!(r.followers(), 2);
    r.push(record("c", 30));
    r.push(record("d", 40));
    assert_eq!(id(f.next().await), "c");
    assert_eq!(id(f.next().await), "d");
    assert_eq!(id(g.next().await), "c");
    drop(f);
    drop(g);
    assert_eq!(r.followers(), 0);
    assert_eq!(r.snapshot().len(), 4, "the ring keeps them all the same");
}

#[tokio::test]
async fn a_follower_too_far_behind_is_told_how_many_it_missed() {
    let r = Records::new(8);
    let (_, mut f) = r.follow(None);
    for i in 0..FOLLOW_BUFFER + 3 {
        r.push(record(&format!("r-{i}"), 0));
    }
    assert_eq!(f.next().await, Some(Followed::Lagged(3)));
    assert_eq!(id(f.next().await), "r-3");
}

#[test]
fn without_a_follower_pushing_keeps_no_channel() {
    let r = Records::new(4);
    r.push(record("a", 1));
    assert!(r.ring.lock().live.is_none(), "no follower ever: no channel");
    let (_, f) = r.follow(None);
    assert!(r.ring.lock().live.is_some());
    drop(f);
    r.push(record("b", 2));
    assert!(
        r.ring.lock().live.is_none(),
        "the first push after the last follower left drops the channel"
    );
    assert_eq!(r.followers(), 0);
}
