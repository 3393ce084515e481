//! The routes of a Service's HTTPRoutes are tried in the Gateway API's order across every
//! route (an `Exact` path, the longest `PathPrefix`, the most header matches, then the oldest
//! route, its name, its rule order), not in the order they were written: translated from
//! objects as `kubectl get -o yaml` prints them and chosen by `core::route::http::select`, what
//! the service's waypoint runs for every request.

mod support;

use ferry_core::authz::HttpRequest;
use ferry_core::model::ServiceKey;
use ferry_core::route::http::select;
use ferry_core::snapshot::Snapshot;

/// Request headers: (name, value).
type Headers<'a> = &'a [(&'a str, &'a str)];

fn route(name: &str, created: &str, rules: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default, creationTimestamp: '{created}'}}
spec:
  parentRefs: [{{group: '', kind: Service, name: audit}}]
  rules: {rules}
"
    )
}

/// The route of `audit` a GET of `path` with `headers` takes.
fn chosen<'s>(s: &'s Snapshot, path: &str, headers: &[(&str, &str)]) -> Option<&'s str> {
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
    select(&audit.http_routes, &req).map(|r| r.name.as_str())
}

#[test]
fn routes_are_tried_in_the_gateway_api_order_of_their_matches() {
    let to = "backendRefs: [{name: ledger, port: 80}]";
    let objects = [
        // Its exact match is its second rule, and still beats every prefix.
        route(
            "b-route",
            "2024-01-01T00:00:00Z",
            &format!(
                "[{{matches: [{{path: {{type: PathPrefix, value: /api}}}}], {to}}}, {{matches: [{{path: {{type: Exact, value: /api/v1}}}}], {to}}}]"
            ),
        ),
        // Newer, but a longer prefix, and a prefix as long as b-route's with a header.
        route(
            "a-route",
            "2025-01-01T00:00:00Z",
            &format!(
                "[{{matches: [{{path: {{type: PathPrefix, value: /api/v1}}}}], {to}}}, {{matches: [{{path: {{type: PathPrefix, value: /api}}, headers: [{{name: x-team, value: blue}}]}}], {to}}}]"
            ),
        ),
        // The oldest: it takes /api ties from b-route, whatever the names.
        route(
            "z-route",
            "2020-01-01T00:00:00Z",
            &format!("[{{matches: [{{path: {{type: PathPrefix, value: /api}}}}], {to}}}]"),
        ),
        // Same age and match: the name decides.
        route(
            "m-route",
            "2024-01-01T00:00:00Z",
            &format!("[{{matches: [{{path: {{type: PathPrefix, value: /x}}}}], {to}}}]"),
        ),
        route(
            "k-route",
            "2024-01-01T00:00:00Z",
            &format!("[{{matches: [{{path: {{type: PathPrefix, value: /x}}}}], {to}}}]"),
        ),
        // Two matches of one rule stand apart: the exact one among the exact ones (after
        // b-route's, by name), the catch-all (`/`) last.
        route(
            "d-route",
            "2024-01-01T00:00:00Z",
            &format!(
                "[{{matches: [{{path: {{type: PathPrefix, value: /}}}}, {{path: {{type: Exact, value: /only}}}}], {to}}}]"
            ),
        ),
    ];
    let (s, notes) = support::mesh(&objects.concat(), "");
    assert!(
        !notes.iter().any(|n| n.object.starts_with("HTTPRoute")),
        "{notes:?}"
    );
    let cases: [(&str, Headers<'_>, &str); 8] = [
        ("/api/v1", &[], "b-route.1"),
        ("/api/v1/x", &[], "a-route.0"),
        ("/api/v1", &[("x-team", "blue")], "b-route.1"),
        ("/api/x", &[("x-team", "blue")], "a-route.1"),
        ("/api/x", &[], "z-route.0"),
        ("/x/y", &[], "k-route.0"),
        ("/only", &[], "d-route.0.1"),
        ("/elsewhere", &[], "d-route.0.0"),
    ];
    for (path, headers, want) in cases {
        assert_eq!(
            chosen(&s, path, headers),
            Some(want),
            "GET {path} {headers:?}"
        );
    }
    let audit = s
        .service(&ServiceKey::new(
            "default",
            "audit.default.svc.cluster.local",
        ))
        .unwrap();
    let order: Vec<&str> = audit.http_routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        order,
        [
            "b-route.1",
            "d-route.0.1",
            "a-route.0",
            "a-route.1",
            "z-route.0",
            "b-route.0",
            "k-route.0",
            "m-route.0",
            "d-route.0.0",
        ]
    );
}
