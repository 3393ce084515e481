use super::*;

const NODE: &str = "node-1";

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod(ns: &str, name: &str) -> PodFacts {
    PodFacts {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: Some(NODE.into()),
        phase: Some("Running".into()),
        ..PodFacts::default()
    }
}

fn none() -> (BTreeSet<String>, BTreeSet<String>) {
    (BTreeSet::new(), BTreeSet::new())
}

fn flags<'a>(sets: &'a (BTreeSet<String>, BTreeSet<String>), all: bool) -> Override<'a> {
    Override {
        namespaces: &sets.0,
        all_namespaces: all,
        excluded: &sets.1,
    }
}

const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");
const NONE: (&str, &str) = ("istio.io/dataplane-mode", "none");

#[test]
fn the_namespace_label_enrolls_its_pods() {
    let sets = none();
    let ns = labels(&[AMBIENT]);
    assert_eq!(
        decide(NODE, Some(&ns), flags(&sets, false), &pod("shop", "web")),
        Verdict::Enroll
    );
    let plain = labels(&[("team", "a")]);
    assert_eq!(
        decide(NODE, Some(&plain), flags(&sets, false), &pod("shop", "web")),
        Verdict::Leave(Why::NotAsked)
    );
    assert_eq!(
        decide(NODE, None, flags(&sets, false), &pod("shop", "web")),
        Verdict::Leave(Why::NotAsked)
    );
}

#[test]
fn the_pods_label_overrides_its_namespaces_and_none_opts_out() {
    let sets = none();
    let mut p = pod("shop", "web");
    p.labels = labels(&[AMBIENT]);
    assert_eq!(
        decide(NODE, None, flags(&sets, false), &p),
        Verdict::Enroll,
        "a pod labelled ambient in a namespace that is not"
    );
    p.labels = labels(&[NONE]);
    let ns = labels(&[AMBIENT]);
    assert_eq!(
        decide(NODE, Some(&ns), flags(&sets, false), &p),
        Verdict::Leave(Why::OptedOut)
    );
    // The flags stand for the namespace's label, never for the pod's.
    let forced = (BTreeSet::from(["shop".to_string()]), BTreeSet::new());
    assert_eq!(
        decide(NODE, None, flags(&forced, false), &p),
        Verdict::Leave(Why::OptedOut)
    );
}

#[test]
fn the_flags_enroll_a_namespace_as_its_label_would() {
    let forced = (BTreeSet::from(["shop".to_string()]), BTreeSet::new());
    assert_eq!(
        decide(NODE, None, flags(&forced, false), &pod("shop", "web")),
        Verdict::Enroll
    );
    assert_eq!(
        decide(NODE, None, flags(&forced, false), &pod("other", "web")),
        Verdict::Leave(Why::NotAsked)
    );
    let all = (BTreeSet::new(), BTreeSet::from(["kube-system".to_string()]));
    assert_eq!(
        decide(NODE, None, flags(&all, true), &pod("other", "web")),
        Verdict::Enroll
    );
    assert_eq!(
        decide(NODE, None, flags(&all, true), &pod("kube-system", "dns")),
        Verdict::Leave(Why::NotAsked)
    );
}

#[test]
fn host_network_sidecar_ended_and_other_node_pods_are_never_enrolled() {
    let sets = none();
    let ns = labels(&[AMBIENT]);
    let decide = |p: &PodFacts| decide(NODE, Some(&ns), flags(&sets, false), p);
    let mut p = pod("shop", "web");
    p.labels = labels(&[AMBIENT]);
    p.host_network = true;
    assert_eq!(decide(&p), Verdict::Leave(Why::HostNetwork));
    let mut p = pod("shop", "web");
    p.annotations = labels(&[("sidecar.istio.io/status", "{}")]);
    assert_eq!(decide(&p), Verdict::Leave(Why::Sidecar));
    for phase in ["Succeeded", "Failed"] {
        let mut p = pod("shop", "job");
        p.phase = Some(phase.into());
        assert_eq!(decide(&p), Verdict::Leave(Why::Ended), "{phase}");
    }
    let mut p = pod("shop", "web");
    p.phase = Some("Pending".into());
    assert_eq!(decide(&p), Verdict::Enroll, "a starting pod is enrolled");
    let mut p = pod("shop", "web");
    p.node = Some("node-2".into());
    assert_eq!(decide(&p), Verdict::Leave(Why::OtherNode));
}

fn entry(p: &PodFacts, enrolled: bool) -> Entry {
    Entry {
        key: p.uid.clone(),
        pod: PodRef {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
        },
        enrolled,
    }
}

#[test]
fn the_plan_enrolls_unenrolls_and_forgets_as_labels_and_pods_change() {
    let sets = none();
    let namespaces = BTreeMap::from([
        ("shop".to_string(), labels(&[AMBIENT])),
        ("plain".to_string(), Labels::new()),
    ]);
    let web = pod("shop", "web");
    let db = pod("plain", "db");
    let mut job = pod("shop", "job");
    job.phase = Some("Succeeded".into());
    let gone = pod("shop", "gone");
    let mut late = pod("shop", "late");
    late.uid = "uid-late".into();
    late.ips = vec!["198.18.62.10".parse().unwrap()];
    let pods: BTreeMap<String, PodFacts> = [&web, &db, &job, &late]
        .into_iter()
        .map(|p| (p.key(), p.clone()))
        .collect();
    let view = View {
        node: NODE,
        namespaces: &namespaces,
        pods: &pods,
        flags: flags(&sets, false),
    };
    let entries = [
        entry(&web, false),
        entry(&db, true),
        entry(&job, true),
        entry(&gone, true),
    ];
    assert_eq!(
        plan(&view, &entries),
        vec![
            Action::Enroll {
                key: "uid-web".into()
            },
            Action::Unenroll {
                key: "uid-db".into(),
                why: Why::NotAsked
            },
            Action::Unenroll {
                key: "uid-job".into(),
                why: Why::Ended
            },
            Action::Forget {
                key: "uid-gone".into()
            },
            Action::Unknown {
                pod: late.pod_ref(),
                ips: late.ips,
            },
        ]
    );
    // A pod recreated under the same name is another pod: the old entry is forgotten.
    let mut again = web.clone();
    again.uid = "uid-web-2".into();
    let pods = BTreeMap::from([(again.key(), again)]);
    let view = View {
        pods: &pods,
        ..view
    };
    assert_eq!(
        plan(&view, &[entry(&web, true)]),
        vec![
            Action::Forget {
                key: "uid-web".into()
            },
            Action::Unknown {
                pod: PodRef {
                    namespace: "shop".into(),
                    name: "web".into(),
                    uid: "uid-web-2".into(),
                },
                ips: Vec::new(),
            }
        ]
    );
}

#[test]
fn annotations_follow_what_the_agent_holds() {
    let sets = none();
    let namespaces = BTreeMap::new();
    let mut web = pod("shop", "web");
    let mut db = pod("shop", "db");
    db.annotations = labels(&[("ambient.istio.io/redirection", "enabled")]);
    let mut node = pod("ferry-system", "node");
    node.annotations = labels(&[("ambient.istio.io/redirection", "disabled")]);
    let pods: BTreeMap<String, PodFacts> = [&web, &db, &node]
        .into_iter()
        .map(|p| (p.key(), p.clone()))
        .collect();
    let view = View {
        node: NODE,
        namespaces: &namespaces,
        pods: &pods,
        flags: flags(&sets, false),
    };
    let entries = [entry(&web, true), entry(&db, false)];
    assert_eq!(
        annotations(&view, &entries),
        vec![
            Annotate {
                namespace: "shop".into(),
                name: "db".into(),
                enabled: false
            },
            Annotate {
                namespace: "shop".into(),
                name: "web".into(),
                enabled: true
            },
        ],
        "set where held, removed where not, another value left alone"
    );
    web.annotations = labels(&[("ambient.istio.io/redirection", "enabled")]);
    db.annotations.clear();
    let pods: BTreeMap<String, PodFacts> = [&web, &db, &node]
        .into_iter()
        .map(|p| (p.key(), p.clone()))
        .collect();
    let view = View {
        pods: &pods,
        ..view
    };
    assert!(annotations(&view, &entries).is_empty(), "nothing to change");
}
