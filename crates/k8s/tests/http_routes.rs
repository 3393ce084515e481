//! Gateway API `HTTPRoute`s attached to a Service become the routes its waypoint applies, read
//! through the watch from an in-process API server (`ferry_k8s::testing`, the real kube-rs
//! client over a real socket) and chosen by `core::route::http::select`; a rule Ferry cannot
//! apply as written is left out with a note naming it.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::authz::HttpRequest;
use ferry_core::model::ServiceKey;
use ferry_core::route::http::select;
use ferry_core::snapshot::Snapshot;
use ferry_k8s::Note;
use ferry_k8s::testing::ApiServer;
use ferry_k8s::watch::{Cluster, WatchConfig, WatchStatus, run};
use serde_json::json;
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);

/// Which route of `audit` a GET of `path` with `headers` takes, and its backends' services.
fn chosen(s: &Snapshot, path: &str, headers: &[(&str, &str)]) -> Option<(String, Vec<String>)> {
    let audit = s.service(&ServiceKey::new(
        "default",
        "audit.default.svc.cluster.local",
    ))?;
    let req = HttpRequest {
        method: "GET",
        path,
        query: "",
        host: "audit.default.svc.cluster.local",
        headers,
    };
    let r = select(&audit.http_routes, &req)?;
    Some((
        r.name.clone(),
        r.backends
            .iter()
            .map(|b| b.service.hostname.clone())
            .collect(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_route_on_a_service_is_applied_by_its_waypoint() {
    let fixture = std::fs::read_to_string(format!(
        "{}/tests/fixtures/two-clusters/alpha.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let alpha = ApiServer::start(&[&fixture]).await;
    let (mesh_tx, mut meshes) = watch::channel::<Option<(Arc<Snapshot>, Vec<Note>)>>(None);
    let (status_tx, _status) = watch::channel(WatchStatus::default());
    let clusters = vec![Cluster {
        id: "alpha".into(),
        network: None,
        client: alpha.client(),
    }];
    let task = tokio::spawn(run(clusters, WatchConfig::default(), status_tx, move |o| {
        if let Ok(ferry_k8s::watch::Mesh {
            topology: t,
            notes: n,
            ..
        }) = o
        {
            mesh_tx.send_replace(Some((Arc::new(t.snapshot), n)));
        }
    }));
    let mut until = async |why: &str, what: &dyn Fn(&Snapshot, &[Note]) -> bool| {
        tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some((s, n)) = meshes.borrow_and_update().clone()
                    && what(&s, &n)
                {
                    return (s, n);
                }
                meshes.changed().await.expect("the watch runs");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no mesh where {why} within {DEADLINE:?}"))
    };

    alpha.apply(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "audit-split", "namespace": "default"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "audit"}],
            "rules": [
                {"matches": [{"headers": [{"name": "X-Canary", "value": "yes"}]}],
                 "backendRefs": [{"name": "ledger", "port": 80}], "timeouts": {"request": "2s"}},
                {"matches": [{"path": {"type": "RegularExpression", "value": "/re.*"}}],
                 "backendRefs": [{"name": "ledger", "port": 80}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
                 "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "elsewhere"}}],
                 "backendRefs": [{"name": "ledger", "port": 80}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/ledger"}}],
                 "backendRefs": [{"name": "ledger", "port": 80, "weight": 3}, {"name": "audit", "port": 80, "weight": 1}]},
            ],
        },
    }));
    let (s, notes) = until("the route's rules are in", &|s, _| {
        chosen(s, "/ledger/x", &[]).is_some()
    })
    .await;
    let ledger = "ledger.default.svc.cluster.local".to_string();
    let audit = "audit.default.svc.cluster.local".to_string();
    assert_eq!(
        chosen(&s, "/anything", &[("x-canary", "yes")]),
        Some(("audit-split.0".into(), vec![ledger.clone()])),
        "a header match (its name in lower case)"
    );
    assert_eq!(
        chosen(&s, "/ledger/x", &[]),
        Some(("audit-split.3".into(), vec![ledger.clone(), audit.clone()]))
    );
    assert_eq!(
        chosen(&s, "/v2/x", &[]),
        None,
        "the rule with a filter is left out"
    );
    assert_eq!(
        chosen(&s, "/rest", &[]),
        None,
        "the regular expression is left out"
    );
    let svc = s
        .service(&ServiceKey::new(
            "default",
            "audit.default.svc.cluster.local",
        ))
        .unwrap();
    let header_rule = svc.http_routes.iter().find(|r| r.name == "audit-split.0");
    assert_eq!(header_rule.map(|r| r.timeout_ms), Some(2000));
    let route_notes: Vec<&str> = notes
        .iter()
        .filter(|n| n.object == "HTTPRoute default/audit-split")
        .map(|n| n.message.as_str())
        .collect();
    assert_eq!(
        route_notes,
        [
            "rule 1 left out: a path match of type RegularExpression",
            "rule 2 left out: a filter of type URLRewrite is not applied by Ferry",
        ]
    );

    // On a Service without a waypoint it does nothing, and says so.
    alpha.edit(
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
        "default/audit-split",
        |r| {
            r["spec"]["parentRefs"][0]["name"] = json!("ledger");
        },
    );
    let (s, notes) = until("the route moved", &|s, _| {
        chosen(s, "/ledger/x", &[]).is_none()
    })
    .await;
    assert!(
        notes
            .iter()
            .any(|n| n.object == "HTTPRoute default/audit-split"
                && n.message.contains("has no waypoint")),
        "{notes:?}"
    );
    let ledger_svc = s
        .service(&ServiceKey::new(
            "default",
            "ledger.default.svc.cluster.local",
        ))
        .unwrap();
    assert!(ledger_svc.http_routes.is_empty());

    task.abort();
    alpha.stop();
}
