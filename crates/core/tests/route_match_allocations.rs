//! Choosing a request's HTTP route allocates nothing when its matches name path, method and
//! headers (the paths every request to a routed service takes), nor for query matches on a
//! query without escapes. The query is read once, whatever the routes compare: each escaped
//! name or value among its parameters read is decoded into one new string, once per request.
//! One test alone in its binary: the allocator's counts are global.

use std::alloc::System;
use std::collections::BTreeMap;

use ferry_core::authz::HttpRequest;
use ferry_core::model::{HttpRoute, PathMatch, RouteBackend, RouteMatch, ServiceKey, StringMatch};
use ferry_core::route::http::select;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn route(name: &str, m: RouteMatch) -> HttpRoute {
    HttpRoute {
        name: name.into(),
        matches: vec![m],
        backends: vec![RouteBackend {
            service: ServiceKey::new("default", "b"),
            port: None,
            subset: BTreeMap::new(),
            weight: 1,
        }],
        timeout_ms: 0,
        retries: 0,
        request_headers: Default::default(),
        response_headers: Default::default(),
        redirect: None,
    }
}

/// Allocations made choosing the route of `req` among `routes`, and its name.
fn allocations(routes: &[HttpRoute], req: &HttpRequest<'_>) -> (usize, Option<String>) {
    let region = Region::new(GLOBAL);
    let chosen = std::hint::black_box(select(routes, req)).map(|r| r.name.as_str());
    let made = region.change().allocations;
    (made, chosen.map(str::to_string))
}

#[test]
fn route_matching_allocates_only_to_decode_escapes_once_per_request() {
    let plain = vec![
        route(
            "exact",
            RouteMatch {
                path: Some(PathMatch::Exact("/a".into())),
                method: Some("POST".into()),
                ..RouteMatch::default()
            },
        ),
        route(
            "header",
            RouteMatch {
                path: Some(PathMatch::Prefix("/v2".into())),
                headers: vec![("x-canary".into(), StringMatch::Exact("yes".into()))],
                ..RouteMatch::default()
            },
        ),
    ];
    let headers = [("x-canary", "yes"), ("accept", "*/*")];
    let req = |method, path, query| HttpRequest {
        method,
        path,
        query,
        host: "h",
        headers: &headers,
    };
    assert_eq!(
        allocations(&plain, &req("GET", "/v2/x", "a=%20&b=+")),
        (0, Some("header".into()))
    );
    assert_eq!(
        allocations(&plain, &req("POST", "/a", "")),
        (0, Some("exact".into()))
    );
    assert_eq!(allocations(&plain, &req("GET", "/b", "")), (0, None));
    let mut query = plain;
    query.insert(
        0,
        route(
            "query",
            RouteMatch {
                query: vec![("v".into(), "2".into())],
                ..RouteMatch::default()
            },
        ),
    );
    assert_eq!(
        allocations(&query, &req("GET", "/v2/x", "a=1&v=2")),
        (0, Some("query".into()))
    );
    let (made, chosen) = allocations(&query, &req("GET", "/v2/x", "a=%31&v=%32"));
    assert_eq!(chosen.as_deref(), Some("query"));
    assert_eq!(made, 2, "decoding an escape makes a string");
    // A parameter no match compares is decoded too: the query is read as a whole, once.
    assert_eq!(
        allocations(&query, &req("GET", "/v2/x", "a=%31&v=2")),
        (1, Some("query".into()))
    );
    // Many routes comparing parameters read the query once: one string per escape, not one
    // per condition.
    let many: Vec<HttpRoute> = (0..8)
        .map(|i| {
            route(
                &format!("v{i}"),
                RouteMatch {
                    query: vec![("x".into(), "1".into()), ("v".into(), i.to_string())],
                    ..RouteMatch::default()
                },
            )
        })
        .collect();
    assert_eq!(
        allocations(&many, &req("GET", "/", "a=%31&x=1&v=7")),
        (1, Some("v7".into()))
    );
    assert_eq!(allocations(&many, &req("GET", "/", "a=%31&v=9")), (1, None));
}
