//! Decoding what a control plane sends never panics: arbitrary bytes, and well-formed messages
//! with arbitrary contents (here: services with HTTP routes, the newest parser) are either
//! accepted or rejected with a reason.

use ferry_api::workload as wl;
use ferry_xds::convert::{decode_address, decode_authorization};
use proptest::prelude::*;
use prost::Message;

fn header_match() -> impl Strategy<Value = wl::FerryHeaderRouteMatch> {
    use wl::ferry_header_route_match::Value;
    (
        "[a-zA-Z-]{0,8}",
        prop_oneof![
            Just(None),
            "[ -~]{0,6}".prop_map(|s| Some(Value::Exact(s))),
            "[ -~]{0,6}".prop_map(|s| Some(Value::Prefix(s))),
            "[ -~]{0,6}".prop_map(|s| Some(Value::Suffix(s))),
            any::<bool>().prop_map(|b| Some(Value::Present(b))),
        ],
    )
        .prop_map(|(name, value)| wl::FerryHeaderRouteMatch { name, value })
}

fn redirect() -> impl Strategy<Value = Option<wl::FerryRequestRedirect>> {
    use wl::ferry_request_redirect::Path;
    let text = || prop::option::of(prop_oneof!["[ -~]{0,8}", Just("https".to_string())]);
    prop::option::of(
        (
            text(),
            text(),
            prop::option::of(prop_oneof![Just(0u32), Just(8443), any::<u32>()]),
            prop_oneof![
                Just(None),
                "[ -~\r\n]{0,8}".prop_map(|p| Some(Path::ReplaceFullPath(p))),
                "[ -~\r\n]{0,8}".prop_map(|p| Some(Path::ReplacePrefixMatch(p))),
            ],
            prop_oneof![Just(301u32), Just(302), any::<u32>()],
        )
            .prop_map(|(scheme, hostname, port, path, status_code)| {
                wl::FerryRequestRedirect {
                    scheme,
                    hostname,
                    port,
                    path,
                    status_code,
                }
            }),
    )
}

fn route() -> impl Strategy<Value = wl::FerryHttpRoute> {
    use wl::ferry_route_match::Path;
    let matches = prop::collection::vec(
        (
            prop_oneof![
                Just(None),
                "[ -~]{0,8}".prop_map(|p| Some(Path::PathExact(p))),
                "[ -~]{0,8}".prop_map(|p| Some(Path::PathPrefix(p))),
            ],
            prop::collection::vec(header_match(), 0..3),
            prop_oneof![Just(String::new()), Just("GET".to_string()), "[ -~]{0,6}"],
            prop::collection::vec(
                ("[ -~]{0,4}", "[ -~]{0,4}")
                    .prop_map(|(name, exact)| wl::FerryQueryParamMatch { name, exact }),
                0..3,
            ),
        )
            .prop_map(
                |(path, headers, method, query_params)| wl::FerryRouteMatch {
                    path,
                    headers,
                    method,
                    query_params,
                },
            ),
        0..3,
    );
    let backends = prop::collection::vec(
        (
            "[a-z/.]{0,12}",
            any::<u32>(),
            prop::collection::btree_map("[a-z]{0,4}", "[a-z]{0,4}", 0..3),
            prop_oneof![Just(0u32), Just(1), any::<u32>()],
        )
            .prop_map(|(service, port, subset, weight)| wl::FerryRouteBackend {
                service,
                port,
                subset,
                weight,
            }),
        0..4,
    );
    (
        ("[ -~]{0,8}", matches, backends, any::<u32>(), any::<u32>()),
        (modifier(), modifier(), redirect()),
    )
        .prop_map(
            |((name, matches, backends, timeout_ms, retries), (request, response, redirect))| {
                wl::FerryHttpRoute {
                    name,
                    matches,
                    backends,
                    timeout_ms,
                    retries,
                    request_headers: request,
                    response_headers: response,
                    redirect,
                }
            },
        )
}

/// Header edits with any names and values (some valid, some not: pseudo-headers, `host`,
/// control bytes, non-ASCII).
fn modifier() -> impl Strategy<Value = Option<wl::FerryHeaderModifier>> {
    let name = prop_oneof![
        "[a-zA-Z-]{0,8}",
        Just("host".to_string()),
        Just(":path".to_string()),
        "\\PC{0,4}",
    ];
    let header = (
        name.clone(),
        prop_oneof!["[ -~]{0,6}", "\\PC{0,4}", "[\\x00-\\x1f]{1,2}"],
    )
        .prop_map(|(name, value)| wl::FerryHeader { name, value });
    prop::option::of(
        (
            prop::collection::vec(header.clone(), 0..3),
            prop::collection::vec(header, 0..3),
            prop::collection::vec(name, 0..3),
        )
            .prop_map(|(set, add, remove)| wl::FerryHeaderModifier { set, add, remove }),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_address("x", &bytes);
        let _ = decode_authorization("x", &bytes);
    }

    #[test]
    fn services_with_arbitrary_routes_decode_or_are_rejected(routes in prop::collection::vec(route(), 0..3)) {
        let zero_weight = routes
            .iter()
            .any(|r| r.redirect.is_none() && r.backends.iter().all(|b| b.weight == 0));
        // A redirect and backends exclude each other.
        let both = routes
            .iter()
            .any(|r| r.redirect.is_some() && !r.backends.is_empty());
        let service = wl::Service {
            name: "shop".into(),
            namespace: "default".into(),
            hostname: "shop.default.svc.cluster.local".into(),
            ferry_http_routes: routes,
            ..Default::default()
        };
        let address = wl::Address {
            r#type: Some(wl::address::Type::Service(service)),
        };
        match decode_address("default/shop.default.svc.cluster.local", &address.encode_to_vec()) {
            Ok(_) => {
                prop_assert!(!zero_weight, "a route without weight was accepted");
                prop_assert!(!both, "a route with a redirect and backends was accepted");
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
