//! Table tests for outlier detection: every rule, time passed in.

use std::time::{Duration, Instant};

use super::*;
use crate::testing::MeshBuilder;

/// Service echo with `n` endpoints echo-0.., all on one node.
fn service_of(n: usize) -> Snapshot {
    let mut m = MeshBuilder::new();
    m.cluster("c", "net").node("n1", "c", "r/z/s");
    m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
    for i in 0..n {
        let name = format!("echo-{i}");
        m.pod(&name, "n1", &format!("198.18.1.{}", 10 + i));
        m.backs(&name, "echo");
    }
    m.build()
}

fn uid(i: usize) -> WorkloadUid {
    WorkloadUid::new(format!("c//v1/Pod/default/echo-{i}"))
}

const S: Duration = Duration::from_secs(1);

/// Fails `uid` `n` times at `now`; the last verdict.
fn fail(o: &mut Outliers, snap: &Snapshot, uid: &WorkloadUid, n: u32, now: Instant) -> Verdict {
    let mut last = None;
    for _ in 0..n {
        last = Some(o.failure(snap, uid, now));
    }
    last.expect("at least one failure")
}

#[test]
fn five_failures_in_a_row_eject_for_the_base_time() {
    let snap = service_of(4);
    let mut o = Outliers::new(OutlierConfig::default());
    let t0 = Instant::now();
    for k in 1..=4 {
        assert_eq!(
            o.failure(&snap, &uid(0), t0),
            Verdict::Counted { failures: k }
        );
    }
    assert!(o.ejected().is_empty());
    assert_eq!(
        o.failure(&snap, &uid(0), t0),
        Verdict::Ejected {
            duration: 30 * S,
            times: 1
        }
    );
    assert!(o.ejected().contains(&uid(0)));
    assert_eq!(o.ejected().len(), 1);
    assert_eq!(o.next_return(), Some(t0 + 30 * S));
    assert_eq!(o.failure(&snap, &uid(0), t0), Verdict::AlreadyEjected);
    // Not yet back a moment before; back at the end of its time.
    assert!(o.expire(t0 + 29 * S).is_empty());
    assert_eq!(o.expire(t0 + 30 * S), vec![uid(0)]);
    assert!(o.ejected().is_empty());
}

#[test]
fn a_success_resets_the_count() {
    let snap = service_of(4);
    let mut o = Outliers::new(OutlierConfig::default());
    let t0 = Instant::now();
    fail(&mut o, &snap, &uid(0), 4, t0);
    assert!(o.success(&uid(0)));
    assert!(!o.success(&uid(0)), "nothing left to reset");
    assert_eq!(
        fail(&mut o, &snap, &uid(0), 4, t0),
        Verdict::Counted { failures: 4 }
    );
    assert!(o.ejected().is_empty());
    assert!(matches!(
        o.failure(&snap, &uid(0), t0),
        Verdict::Ejected { .. }
    ));
}

#[test]
fn the_ejection_grows_on_repeat_up_to_the_cap() {
    let snap = service_of(4);
    let mut o = Outliers::new(OutlierConfig::default());
    let mut now = Instant::now();
    let mut lengths = Vec::new();
    for _ in 0..12 {
        match fail(&mut o, &snap, &uid(0), 5, now) {
            Verdict::Ejected { duration, .. } => lengths.push(duration.as_secs()),
            other => panic!("not ejected: {other:?}"),
        }
        // Back at the end of it, and failing again at once.
        now += o.next_return().unwrap() - now;
        assert_eq!(o.expire(now), vec![uid(0)]);
    }
    assert_eq!(
        lengths,
        [30, 60, 90, 120, 150, 180, 210, 240, 270, 300, 300, 300]
    );
}

#[test]
fn the_backoff_starts_over_after_a_stable_max_ejection() {
    let snap = service_of(4);
    let mut o = Outliers::new(OutlierConfig::default());
    let t0 = Instant::now();
    fail(&mut o, &snap, &uid(0), 5, t0);
    o.expire(t0 + 30 * S);
    // Failing again soon after: twice as long.
    assert!(matches!(
        fail(&mut o, &snap, &uid(0), 5, t0 + 31 * S),
        Verdict::Ejected { times: 2, .. }
    ));
    let back = t0 + 91 * S;
    assert_eq!(o.expire(back), vec![uid(0)]);
    // Fine for a whole max_ejection (300 s) since it came back: from the base again.
    assert_eq!(
        fail(&mut o, &snap, &uid(0), 5, back + 300 * S),
        Verdict::Ejected {
            duration: 30 * S,
            times: 1
        }
    );
}

#[test]
fn never_more_than_the_share_of_a_services_endpoints() {
    let t0 = Instant::now();
    // (endpoints, how many of them may be ejected at once at 50 %)
    for (n, allowed) in [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (10, 5)] {
        let snap = service_of(n);
        let mut o = Outliers::new(OutlierConfig::default());
        for i in 0..n {
            let v = fail(&mut o, &snap, &uid(i), 5, t0);
            if i < allowed {
                assert!(matches!(v, Verdict::Ejected { .. }), "{n}: {i}: {v:?}");
            } else {
                assert_eq!(v, Verdict::CapReached { failures: 5 }, "{n}: {i}");
            }
        }
        assert_eq!(o.ejected().len(), allowed, "{n} endpoints");
    }
    // Once one comes back, another that keeps failing takes its place.
    let snap = service_of(2);
    let mut o = Outliers::new(OutlierConfig::default());
    fail(&mut o, &snap, &uid(0), 5, t0);
    assert_eq!(
        fail(&mut o, &snap, &uid(1), 5, t0),
        Verdict::CapReached { failures: 5 }
    );
    o.expire(t0 + 30 * S);
    assert!(matches!(
        o.failure(&snap, &uid(1), t0 + 30 * S),
        Verdict::Ejected { .. }
    ));
    assert_eq!(o.ejected(), [uid(1)].into_iter().collect());
}

#[test]
fn zero_failures_turns_ejection_off_and_unknown_endpoints_are_never_ejected() {
    let snap = service_of(4);
    let mut o = Outliers::new(OutlierConfig {
        consecutive_failures: 0,
        ..OutlierConfig::default()
    });
    let t0 = Instant::now();
    assert_eq!(
        fail(&mut o, &snap, &uid(0), 50, t0),
        Verdict::Counted { failures: 50 }
    );
    let mut o = Outliers::new(OutlierConfig::default());
    let gone = WorkloadUid::new("c//v1/Pod/default/gone");
    assert_eq!(
        fail(&mut o, &snap, &gone, 5, t0),
        Verdict::CapReached { failures: 5 }
    );
    o.retain_known(&snap);
    assert_eq!(
        o.failure(&snap, &gone, t0),
        Verdict::Counted { failures: 1 }
    );
}
