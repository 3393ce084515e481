//! HTTPRoute rules with a `RequestRedirect` filter, translated from objects as `kubectl get -o
//! yaml` prints them: a valid redirect becomes the route's redirect (no backends), split per
//! match; a rule with backendRefs too, or with an invalid redirect, is left out with a note
//! naming the field.

mod support;

use ferry_core::model::{RedirectPath, RedirectScheme, RequestRedirect, ServiceKey};

const ROUTE: &str = "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: default, creationTimestamp: '2025-01-01T00:00:00Z'}
spec:
  parentRefs: [{group: '', kind: Service, name: audit}]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /old}
    filters:
    - type: RequestRedirect
      requestRedirect:
        scheme: https
        hostname: New.Example
        port: 8443
        path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}
        statusCode: 301
  - matches:
    - path: {type: Exact, value: /login}
    filters:
    - type: RequestRedirect
      requestRedirect: {hostname: login.example}
  - matches:
    - path: {type: PathPrefix, value: /both}
    filters:
    - type: RequestRedirect
      requestRedirect: {hostname: a.example}
    backendRefs: [{name: ledger, port: 80}]
  - matches:
    - path: {type: PathPrefix, value: /s}
    filters:
    - type: RequestRedirect
      requestRedirect: {statusCode: 307}
  - matches:
    - path: {type: PathPrefix, value: /h}
    filters:
    - type: RequestRedirect
      requestRedirect: {hostname: \"a.example\\r\\nset-cookie: x\"}
  - matches:
    - path: {type: PathPrefix, value: /p}
    filters:
    - type: RequestRedirect
      requestRedirect: {port: 0}
  - matches:
    - path: {type: PathPrefix, value: /f}
    filters:
    - type: RequestRedirect
      requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: relative}}
  - matches:
    - path: {type: Exact, value: /x}
    filters:
    - type: RequestRedirect
      requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /y}}
  - matches:
    - path: {type: PathPrefix, value: /c}
    filters:
    - type: RequestRedirect
      requestRedirect: {scheme: ftp}
";

#[test]
fn redirects_are_translated_and_bad_ones_left_out_naming_the_field() {
    let (s, notes) = support::mesh(ROUTE, "");
    let routes = &s
        .service(&ServiceKey::new(
            "default",
            "audit.default.svc.cluster.local",
        ))
        .unwrap()
        .http_routes;
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["shop.1", "shop.0"], "{notes:?}");
    let moved = routes.iter().find(|r| r.name == "shop.0").unwrap();
    assert!(moved.backends.is_empty());
    assert_eq!(
        moved.redirect.as_deref(),
        Some(&RequestRedirect {
            scheme: Some(RedirectScheme::Https),
            hostname: Some("new.example".into()),
            port: Some(8443),
            path: Some(RedirectPath::PrefixMatch("/new".into())),
            status: 301,
        })
    );
    let login = routes.iter().find(|r| r.name == "shop.1").unwrap();
    assert_eq!(
        login.redirect.as_deref(),
        Some(&RequestRedirect {
            hostname: Some("login.example".into()),
            ..RequestRedirect::default()
        })
    );
    let route_notes: Vec<&str> = notes
        .iter()
        .filter(|n| n.object == "HTTPRoute default/shop")
        .map(|n| n.message.as_str())
        .collect();
    assert_eq!(
        route_notes,
        [
            "rule 2 left out: a RequestRedirect filter with backendRefs (the Gateway API makes them exclusive)",
            "rule 3 left out: requestRedirect.statusCode: expected 301 or 302, found 307",
            "rule 4 left out: requestRedirect.hostname: expected a DNS name (letters, digits, '-', '.'), found \"a.example\\r\\nset-cookie: x\"",
            "rule 5 left out: requestRedirect.port: expected a port from 1 to 65535, found 0",
            "rule 6 left out: requestRedirect.path.replaceFullPath: expected a path starting with one '/', visible ASCII without '?' or '#', found \"relative\"",
            "rule 7 left out: requestRedirect.path.replacePrefixMatch: expected only PathPrefix matches, found an Exact path in matches[0]",
            "rule 8 left out: requestRedirect.scheme: expected http or https, found \"ftp\"",
        ]
    );
}
