use super::*;

fn conditions(
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
) -> EndpointConditions {
    EndpointConditions {
        ready,
        serving,
        terminating,
    }
}

const fn pod_state(healthy: bool, terminating: bool) -> PodState {
    PodState {
        healthy,
        terminating,
    }
}

/// Healthy, unhealthy, terminating while serving, terminating and not serving.
const HEALTHY: PodState = pod_state(true, false);
const UNHEALTHY: PodState = pod_state(false, false);
const DRAINING: PodState = pod_state(true, true);
const DEAD: PodState = pod_state(false, true);

/// Every combination of the three conditions (each true, false or nil), and none at all.
#[test]
fn conditions_give_the_pod_state() {
    let (t, f, n) = (Some(true), Some(false), None);
    #[rustfmt::skip]
    let table = [
        // ready, serving, terminating -> state
        (t, t, f, HEALTHY), (t, t, n, HEALTHY), (t, t, t, DRAINING),
        (t, f, f, UNHEALTHY), (t, f, n, UNHEALTHY), (t, f, t, DEAD),
        (t, n, f, HEALTHY), (t, n, n, HEALTHY), (t, n, t, DRAINING),
        (f, t, f, HEALTHY), (f, t, n, HEALTHY), (f, t, t, DRAINING),
        (f, f, f, UNHEALTHY), (f, f, n, UNHEALTHY), (f, f, t, DEAD),
        // A nil serving defers to ready.
        (f, n, f, UNHEALTHY), (f, n, n, UNHEALTHY), (f, n, t, DEAD),
        (n, t, f, HEALTHY), (n, t, n, HEALTHY), (n, t, t, DRAINING),
        (n, f, f, UNHEALTHY), (n, f, n, UNHEALTHY), (n, f, t, DEAD),
        // All nil: ready, serving, not terminating.
        (n, n, f, HEALTHY), (n, n, n, HEALTHY), (n, n, t, DRAINING),
    ];
    for (ready, serving, terminating, want) in table {
        let c = conditions(ready, serving, terminating);
        assert_eq!(state(Some(&c)), want, "{c:?}");
    }
    assert_eq!(state(None), HEALTHY, "no conditions at all");
}

fn slice(name: &str, endpoints: &serde_json::Value) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "labels": {SERVICE_NAME: "echo"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn endpoint(pod: &str, conditions: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "addresses": ["198.18.1.20"],
        "conditions": conditions,
        "targetRef": {"kind": "Pod", "namespace": "default", "name": pod, "uid": format!("uid-{pod}")},
    })
}

fn pod(name: &str, uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
    }))
    .unwrap()
}

/// Terminating if any slice says so; else unhealthy if any says not serving; else healthy.
#[test]
fn a_pod_in_several_slices_takes_the_most_cautious_state() {
    let healthy = serde_json::json!({"ready": true, "serving": true, "terminating": false});
    let unserving = serde_json::json!({"ready": false, "serving": false});
    let draining = serde_json::json!({"ready": false, "serving": true, "terminating": true});
    let mut s = SliceStates::default();
    for (i, conditions) in [&healthy, &unserving, &draining, &healthy, &unserving]
        .into_iter()
        .enumerate()
    {
        // Pod a: in slice 0 and 1; b: 1 and 2; c: 2 and 3; d: 3 only.
        let pods: &[&str] = match i {
            0 => &["a"],
            1 => &["a", "b"],
            2 => &["b", "c"],
            3 => &["c", "d"],
            _ => &[],
        };
        let eps = pods.iter().map(|p| endpoint(p, conditions)).collect();
        assert_eq!(s.add(&slice(&format!("echo-{i}"), &eps)), None);
    }
    let of = |name: &str| s.of(&pod(name, &format!("uid-{name}")));
    assert_eq!(of("a"), Some(UNHEALTHY), "not serving in one slice");
    assert_eq!(
        of("b"),
        Some(DEAD),
        "terminating in one, not serving in one"
    );
    assert_eq!(of("c"), Some(DRAINING), "terminating in one slice");
    assert_eq!(of("d"), Some(HEALTHY));
    assert_eq!(of("e"), None, "in no slice: the pod's own rule applies");
}

#[test]
fn an_endpoint_of_an_earlier_pod_of_the_same_name_says_nothing() {
    let mut s = SliceStates::default();
    s.add(&slice(
        "web",
        &serde_json::json!([endpoint("web-0", &serde_json::json!({"terminating": true}))]),
    ));
    assert_eq!(
        s.of(&pod("web-0", "uid-web-0")).map(|s| s.terminating),
        Some(true)
    );
    assert_eq!(s.of(&pod("web-0", "uid-web-0-again")), None);
}

#[test]
fn endpoints_that_name_no_pod_are_counted_except_the_api_server_s() {
    let bare = serde_json::json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}]);
    let mut s = SliceStates::default();
    assert_eq!(s.add(&slice("manual", &bare)), Some(2));
    let mut api_server = slice("kubernetes", &bare);
    api_server.metadata.labels = Some([(SERVICE_NAME.into(), "kubernetes".into())].into());
    assert_eq!(s.add(&api_server), None);
    let mut no_service = slice("loose", &bare);
    no_service.metadata.labels = None;
    assert_eq!(s.add(&no_service), None, "not a Service's slice: not read");
    assert!(s.0.is_empty());
}
