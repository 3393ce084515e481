//! What the node's xDS client keeps of what it applied: the version of every resource, with
//! each name held once (a workload's version and its held resource are kept under the
//! workload's own uid, not copies of it), through a first push and a push that changes and
//! removes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::discovery::{DeltaDiscoveryResponse, Resource};
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_core::model::{PortMapping, WorkloadUid};
use ferry_core::store::Store;
use ferry_core::testing::{MeshBuilder, key};
use ferry_xds::client::{ClientConfig, XdsClient};
use ferry_xds::resources::ResourceSet;

fn client(store: Arc<Store>) -> XdsClient {
    XdsClient::new(
        ClientConfig {
            endpoint: "https://127.0.0.1:15012".into(),
            bundle_pem: String::new(),
            server_name: "ferry-control".into(),
            token: String::new(),
            cluster: "east".into(),
            node_id: "ferry~n1".into(),
            plaintext: false,
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
        },
        store,
    )
}

fn mesh(pods: usize) -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").node("n1", "east", "r/z/");
    m.service("svc", &[("net-east", "10.10.0.1")], 80, 8080);
    for i in 0..pods {
        m.pod(
            &format!("pod{i}"),
            "n1",
            &format!("10.0.{}.{}", i / 250, i % 250 + 1),
        );
        // As `m.backs`, without its search by name (a large mesh).
        let w = m.workloads.last_mut().expect("just made");
        let port = PortMapping {
            service_port: 80,
            target_port: 8080,
        };
        w.services = BTreeMap::from([(key("svc"), vec![port])]).into();
    }
    m
}

/// All of `set`'s resources of `type_url` as one response, which also removes `removed`.
fn response(set: &ResourceSet, type_url: &str, removed: &[String]) -> DeltaDiscoveryResponse {
    let resources = set
        .of_type(type_url)
        .into_iter()
        .flat_map(|t| t.iter())
        .map(|(name, v)| Resource {
            version: v.version.clone(),
            resource: Some(prost_types::Any {
                type_url: type_url.to_string(),
                value: (*v.body).clone(),
            }),
            name: name.clone(),
            aliases: vec![],
        })
        .collect();
    DeltaDiscoveryResponse {
        type_url: type_url.to_string(),
        nonce: "1".into(),
        resources,
        removed_resources: removed.to_vec(),
        ..Default::default()
    }
}

/// The client's versions of `type_url` equal the set's, name by name.
fn versions_are_the_sets(client: &XdsClient, set: &ResourceSet, type_url: &str) {
    let st = client.state();
    let st = st.lock();
    let held = st.versions.get(type_url).expect("versions of the type");
    let sent: Vec<(String, String)> = set
        .of_type(type_url)
        .into_iter()
        .flat_map(|t| t.iter())
        .map(|(name, v)| (name.clone(), v.version.clone()))
        .collect();
    assert_eq!(held.len(), sent.len(), "{type_url}");
    for (name, version) in sent {
        assert_eq!(
            held.get(name.as_str()).map(|v| &**v),
            Some(version.as_str()),
            "{name}"
        );
    }
}

#[test]
fn a_workloads_version_and_resource_are_kept_under_its_own_uid_not_a_copy() {
    kept_under_their_own_uids(3);
}

/// A first push large enough to be decoded on every core and to have its versions recorded
/// while the snapshot is assembled (at least 8,192 resources): the same state as a small one.
#[test]
fn a_large_push_applied_on_several_threads_keeps_the_same_versions_and_names() {
    kept_under_their_own_uids(9_000);
}

/// `pods` pods pushed, then a push that changes pod0 and removes the last pod: the client's
/// versions are the pushes', and each workload's name is held once.
fn kept_under_their_own_uids(pods: usize) {
    let store = Arc::new(Store::default());
    let c = client(store.clone());
    let set = ResourceSet::encode(&mesh(pods).build());
    for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
        let ack = c.apply(response(&set, type_url, &[]));
        assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    }
    versions_are_the_sets(&c, &set, ADDRESS_TYPE);
    let one_copy = || {
        let snap = store.load();
        let st = c.state();
        let st = st.lock();
        let versions = &st.versions[ADDRESS_TYPE];
        let mut n = 0;
        for w in snap.workloads() {
            let (name, _) = versions
                .get_key_value(w.uid.as_str())
                .expect("a version for every workload");
            let (held, _) = st
                .held
                .addresses
                .get_key_value(w.uid.as_str())
                .expect("every workload held");
            for copy in [name, held] {
                assert!(
                    std::ptr::eq(copy.as_ptr(), w.uid.as_str().as_ptr()),
                    "{} is held twice",
                    w.uid
                );
            }
            n += 1;
        }
        n
    };
    assert_eq!(one_copy(), pods);

    // A second push: pod0 changes (now on another address), the last pod goes.
    let mut m = mesh(pods - 1);
    m.workload_mut("pod0").addresses = vec![ferry_core::testing::ip("10.1.0.9")];
    let next = ResourceSet::encode(&m.build());
    let gone = WorkloadUid::new(format!("east//v1/Pod/default/pod{}", pods - 1)).to_string();
    let ack = c.apply(response(&next, ADDRESS_TYPE, &[gone]));
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    versions_are_the_sets(&c, &next, ADDRESS_TYPE);
    assert_eq!(one_copy(), pods - 1);
}

/// A first push that names a resource twice keeps the later one's version, as a later push
/// replacing it would.
#[test]
fn a_resource_named_twice_in_a_first_push_keeps_the_later_version() {
    let c = client(Arc::new(Store::default()));
    let set = ResourceSet::encode(&mesh(3).build());
    let mut r = response(&set, ADDRESS_TYPE, &[]);
    let mut again = r.resources[1].clone();
    again.version = "later".into();
    r.resources.push(again.clone());
    let sent = r.resources.len();
    let ack = c.apply(r);
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    let st = c.state();
    let st = st.lock();
    let versions = &st.versions[ADDRESS_TYPE];
    assert_eq!(versions.len(), sent - 1);
    assert_eq!(
        versions.get(again.name.as_str()).map(|v| &**v),
        Some("later")
    );
}

/// A push whose service holds a route edit no route may make (here `host`) is refused and named
/// in the NACK; as for every resource that no longer decodes, that service is no longer held
/// (fail closed: never applied half) while the rest of the mesh stays; a good push brings it
/// back.
#[test]
fn a_route_editing_a_header_no_route_may_edit_is_refused_by_name_and_not_applied() {
    use ferry_core::model::{HeaderModifier, HttpRoute, RouteBackend};
    let with_edit = |name: &str| {
        let mut m = mesh(1);
        let svc = m.service_mut("svc");
        svc.http_routes = vec![HttpRoute {
            name: "r".into(),
            matches: vec![],
            backends: vec![RouteBackend {
                service: key("svc"),
                port: None,
                subset: BTreeMap::new(),
                weight: 1,
            }],
            timeout_ms: 0,
            retries: 0,
            request_headers: HeaderModifier {
                set: vec![(name.into(), "x".into())],
                ..HeaderModifier::default()
            }
            .into(),
            response_headers: Default::default(),
            redirect: None,
        }];
        ResourceSet::encode(&m.build())
    };
    let store = Arc::new(Store::default());
    let c = client(store.clone());
    let edits = || {
        let snap = store.load();
        let svc = snap.service(&key("svc"))?;
        Some(svc.http_routes[0].request_headers.set.clone())
    };
    let pods = || store.load().workloads().count();
    let ack = c.apply(response(&with_edit("x-env"), ADDRESS_TYPE, &[]));
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    let good = Some(vec![("x-env".to_string(), "x".to_string())]);
    assert_eq!(edits(), good);
    assert_eq!(pods(), 1);
    let ack = c.apply(response(&with_edit("host"), ADDRESS_TYPE, &[]));
    let detail = ack.error_detail.expect("a NACK").message;
    assert!(
        detail.contains("default/svc.default.svc.cluster.local")
            && detail.contains("request_headers.set[0].name: expected a header a route may edit"),
        "{detail}"
    );
    assert_eq!(edits(), None, "the refused route is never applied");
    assert_eq!(pods(), 1, "the rest of the mesh stays");
    let ack = c.apply(response(&with_edit("x-env"), ADDRESS_TYPE, &[]));
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    assert_eq!(edits(), good);
}
