//! HTTPRoute rules with `method` and `queryParams` matches and `RequestHeaderModifier` /
//! `ResponseHeaderModifier` filters, translated from objects as `kubectl get -o yaml` prints
//! them and chosen by `core::route::http::select`, what the service's waypoint runs: they are
//! applied as written; a rule with an edit no route may make, a regular expression on a query
//! parameter or another filter is left out with a note naming why.

mod support;

use ferry_core::authz::HttpRequest;
use ferry_core::model::ServiceKey;
use ferry_core::route::http::select;
use ferry_core::snapshot::Snapshot;

const ROUTE: &str = "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: default, creationTimestamp: '2025-01-01T00:00:00Z'}
spec:
  parentRefs: [{group: '', kind: Service, name: audit}]
  rules:
  - matches:
    - method: POST
      path: {type: PathPrefix, value: /orders}
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - queryParams:
      - {name: v, value: '2'}
      - {type: Exact, name: q, value: a b}
      - {name: v, value: '3'}  # ignored: the first of a name counts
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Version, value: '2'}]
        add: [{name: x-hop, value: waypoint}]
        remove: [x-debug]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        remove: [server]
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - path: {type: PathPrefix, value: /host}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: Host, value: evil.example}]
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - path: {type: PathPrefix, value: /te}
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        add: [{name: transfer-encoding, value: chunked}]
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - queryParams: [{type: RegularExpression, name: v, value: '[0-9]+'}]
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - path: {type: PathPrefix, value: /old}
    filters:
    - type: RequestRedirect
      requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /new}}
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - path: {type: PathPrefix, value: /value}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        add: [{name: x-a, value: \"one\\r\\nx-b: two\"}]
    backendRefs: [{name: ledger, port: 80}]
";

/// The route of `audit` a request takes.
fn chosen<'s>(s: &'s Snapshot, method: &str, path: &str, query: &str) -> Option<&'s str> {
    let routes = &s
        .service(&ServiceKey::new(
            "default",
            "audit.default.svc.cluster.local",
        ))?
        .http_routes;
    let req = HttpRequest {
        method,
        path,
        query,
        host: "audit.default.svc.cluster.local",
        headers: &[],
    };
    select(routes, &req).map(|r| r.name.as_str())
}

#[test]
fn method_query_and_header_modifiers_are_applied_and_the_rest_left_out_with_a_note() {
    let (s, notes) = support::mesh(ROUTE, "");
    assert_eq!(chosen(&s, "POST", "/orders/1", ""), Some("shop.0"));
    assert_eq!(chosen(&s, "GET", "/orders/1", ""), None);
    assert_eq!(chosen(&s, "GET", "/", "q=a+b&v=2"), Some("shop.1"));
    assert_eq!(chosen(&s, "GET", "/", "q=a%20b&v=3"), None);
    let routes = &s
        .service(&ServiceKey::new(
            "default",
            "audit.default.svc.cluster.local",
        ))
        .unwrap()
        .http_routes;
    let edited = routes.iter().find(|r| r.name == "shop.1").expect("shop.1");
    assert_eq!(
        edited.request_headers.set,
        [("x-version".to_string(), "2".to_string())]
    );
    assert_eq!(
        edited.request_headers.add,
        [("x-hop".to_string(), "waypoint".to_string())]
    );
    assert_eq!(edited.request_headers.remove, ["x-debug"]);
    assert_eq!(edited.response_headers.remove, ["server"]);
    // Only the two rules Ferry applies as written are in.
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["shop.0", "shop.1"], "{notes:?}");
    let route_notes: Vec<&str> = notes
        .iter()
        .filter(|n| n.object == "HTTPRoute default/shop")
        .map(|n| n.message.as_str())
        .collect();
    assert_eq!(
        route_notes,
        [
            "rule 2 left out: requestHeaderModifier.set[0].name: expected a header a route may edit, found \"host\" (one of host, connection, keep-alive, proxy-connection, transfer-encoding, upgrade, te, trailer, content-length)",
            "rule 3 left out: responseHeaderModifier.add[0].name: expected a header a route may edit, found \"transfer-encoding\" (one of host, connection, keep-alive, proxy-connection, transfer-encoding, upgrade, te, trailer, content-length)",
            "rule 4 left out: a query parameter match of type RegularExpression",
            "rule 5 left out: a RequestRedirect filter with backendRefs (the Gateway API makes them exclusive)",
            "rule 6 left out: requestHeaderModifier.add[0].value: expected a valid header value (visible ASCII, spaces, tabs), found \"one\\r\\nx-b: two\"",
        ]
    );
}

#[test]
fn a_match_with_a_method_goes_before_one_without_and_more_query_matches_first() {
    let route = |name: &str, matches: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default, creationTimestamp: '2024-01-01T00:00:00Z'}}
spec:
  parentRefs: [{{group: '', kind: Service, name: audit}}]
  rules: [{{matches: [{matches}], backendRefs: [{{name: ledger, port: 80}}]}}]
"
        )
    };
    // By name alone `a-*` would come first; the Gateway API's order puts the method, then
    // the most query matches, before it.
    let objects = [
        route("a-plain", "{path: {type: PathPrefix, value: /api}}"),
        route(
            "b-method",
            "{path: {type: PathPrefix, value: /api}, method: GET}",
        ),
        route(
            "c-query",
            "{path: {type: PathPrefix, value: /api}, queryParams: [{name: v, value: '1'}]}",
        ),
    ];
    let (s, notes) = support::mesh(&objects.concat(), "");
    assert!(
        !notes.iter().any(|n| n.object.starts_with("HTTPRoute")),
        "{notes:?}"
    );
    let order: Vec<&str> = s
        .service(&ServiceKey::new(
            "default",
            "audit.default.svc.cluster.local",
        ))
        .unwrap()
        .http_routes
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(order, ["b-method.0", "c-query.0", "a-plain.0"]);
    assert_eq!(chosen(&s, "GET", "/api", "v=1"), Some("b-method.0"));
    assert_eq!(chosen(&s, "POST", "/api", "v=1"), Some("c-query.0"));
    assert_eq!(chosen(&s, "POST", "/api", ""), Some("a-plain.0"));
}

/// Names equal but for case, as the API server lets through (its uniqueness is
/// case-sensitive): in header matches and in each list of a header modifier the first entry
/// counts and the others are ignored, as the Gateway API says.
const SAME_NAMES: &str = "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: cased, namespace: default, creationTimestamp: '2025-01-01T00:00:00Z'}
spec:
  parentRefs: [{group: '', kind: Service, name: audit}]
  rules:
  - matches:
    - headers:
      - {name: X-Canary, value: 'yes'}
      - {name: x-canary, value: 'no'}
      - {type: RegularExpression, name: X-CANARY, value: '.*'}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Env, value: first}, {name: x-env, value: second}]
        add: [{name: x-hop, value: first}, {name: X-Hop, value: second}]
        remove: [X-Debug, x-debug, X-DEBUG]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        set: [{name: x-route, value: first}, {name: X-Route, value: \"bad\\r\\nvalue\"}]
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - path: {type: PathPrefix, value: /placed}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: x-a, value: '1'}, {name: X-A, value: '2'}, {name: Host, value: h}]
    backendRefs: [{name: ledger, port: 80}]
";

#[test]
fn of_names_equal_but_for_case_the_first_entry_counts() {
    let (s, notes) = support::mesh(SAME_NAMES, "");
    let routes = &s
        .service(&ServiceKey::new(
            "default",
            "audit.default.svc.cluster.local",
        ))
        .unwrap()
        .http_routes;
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["cased.0"], "{notes:?}");
    let r = &routes[0];
    let canary = |v: &str| {
        let headers = [("x-canary", v)];
        let req = HttpRequest {
            method: "GET",
            path: "/",
            query: "",
            host: "audit.default.svc.cluster.local",
            headers: &headers,
        };
        select(routes, &req).map(|r| r.name.as_str())
    };
    assert_eq!(canary("yes"), Some("cased.0"));
    assert_eq!(canary("no"), None, "the second entry is ignored");
    assert_eq!(
        r.request_headers.set,
        [("x-env".to_string(), "first".to_string())]
    );
    assert_eq!(
        r.request_headers.add,
        [("x-hop".to_string(), "first".to_string())]
    );
    assert_eq!(r.request_headers.remove, ["x-debug"]);
    assert_eq!(
        r.response_headers.set,
        [("x-route".to_string(), "first".to_string())],
        "an ignored entry is not checked either"
    );
    let route_notes: Vec<&str> = notes
        .iter()
        .filter(|n| n.object == "HTTPRoute default/cased")
        .map(|n| n.message.as_str())
        .collect();
    // Placed as the object lists it: the ignored `X-A` keeps its place.
    assert_eq!(route_notes.len(), 1, "{route_notes:?}");
    assert!(
        route_notes[0]
            .starts_with("rule 1 left out: requestHeaderModifier.set[2].name: expected a header a route may edit, found \"host\""),
        "{route_notes:?}"
    );
}
