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
        )
            .prop_map(|(path, headers)| wl::FerryRouteMatch { path, headers }),
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
    ("[ -~]{0,8}", matches, backends, any::<u32>(), any::<u32>()).prop_map(
        |(name, matches, backends, timeout_ms, retries)| wl::FerryHttpRoute {
            name,
            matches,
            backends,
            timeout_ms,
            retries,
        },
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
            .any(|r| r.backends.iter().all(|b| b.weight == 0));
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
            Ok(_) => prop_assert!(!zero_weight, "a route without weight was accepted"),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
