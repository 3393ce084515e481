//! Choosing a request's HTTP route allocates nothing when its matches name path, method and
//! headers (the paths every request to a routed service takes), nor for query matches whose
//! parameters need no decoding; only a parameter with escapes is decoded into a new string.
//! One test alone in its binary: the allocator's counts are global.

use std::alloc::System;
use std::collections::BTreeMap;

use ferry_core::authz::HttpRequest;
use ferry_core::model::{
    HeaderModifier, HttpRoute, PathMatch, RouteBackend, RouteMatch, ServiceKey, StringMatch,
};
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
        request_headers: HeaderModifier::default(),
        response_headers: HeaderModifier::default(),
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
fn route_matching_allocates_only_to_decode_an_escaped_query_parameter() {
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
    assert!(made > 0, "decoding an escape makes a string");
}
