//! A route's redirect on the wire: its field numbers proven with hand-built bytes, a lossless
//! round trip, and every bad redirect rejected (NACK) naming its field.

mod common;

use common::{ld, vi};

use ferry_api::workload as wl;
use ferry_core::model::{RedirectPath, RedirectScheme, RequestRedirect};
use ferry_xds::convert::{Decoded, decode_address};
use ferry_xds::resources::ResourceSet;
use prost::Message;

const NAME: &str = "default/web.default.svc.cluster.local";

/// A service (field 2 of Address) whose one route (10003) holds `route`'s fields after its name.
fn service_with_route(route: &[u8]) -> Vec<u8> {
    let route = [ld(1, b"r"), route.to_vec()].concat();
    let mut s = Vec::new();
    s.extend(ld(1, b"web"));
    s.extend(ld(2, b"default"));
    s.extend(ld(3, b"web.default.svc.cluster.local"));
    s.extend(ld(10003, &route));
    ld(2, &s)
}

#[test]
fn a_redirect_travels_in_field_8_and_needs_no_backend() {
    // FerryRequestRedirect: scheme 1, hostname 2, port 3, replace_full_path 4,
    // replace_prefix_match 5, status_code 6. A match (2) with path_prefix (2) "/old".
    let redirect = [
        ld(1, b"https"),
        ld(2, b"New.Example"),
        vi(3, 8443),
        ld(5, b"/new"),
        vi(6, 301),
    ]
    .concat();
    let route = [ld(2, &ld(2, b"/old")), ld(8, &redirect)].concat();
    let Decoded::Service(s) =
        decode_address(NAME, &service_with_route(&route)).unwrap_or_else(|e| panic!("{e}"))
    else {
        panic!("not a service");
    };
    let r = &s.http_routes[0];
    assert!(r.backends.is_empty());
    assert_eq!(
        r.redirect.as_deref(),
        Some(&RequestRedirect {
            scheme: Some(RedirectScheme::Https),
            hostname: Some("new.example".into()),
            port: Some(8443),
            path: Some(RedirectPath::PrefixMatch("/new".into())),
            status: 301,
        })
    );
    // A route with neither a redirect nor a backend is still rejected.
    let e = decode_address(NAME, &service_with_route(&ld(2, &ld(2, b"/old")))).unwrap_err();
    assert!(e.to_string().contains("no backend"), "{e}");
}

#[test]
fn a_redirect_round_trips_and_a_route_without_one_encodes_as_before() {
    let doc = "clusters: [{name: c, network: n}]\nwaypoints: [{name: wp}]\nservices:\n  - name: web\n    ports: [{port: 80, target_port: 8080}]\n    waypoint: wp\n    routes:\n      - name: moved\n        match: [{path_prefix: /old}]\n        redirect: {scheme: https, hostname: new.example, port: 8443, replace_prefix_match: /new, status: 301}\n      - name: bare\n        redirect: {}\n      - name: rest\n        backends: [{service: web}]\n";
    let snap = ferry_topology::parse("t.yaml", doc)
        .unwrap_or_else(|e| panic!("{e}"))
        .snapshot;
    let body = &ResourceSet::encode(&snap).by_type[ferry_api::ADDRESS_TYPE][NAME].body;
    let Ok(Decoded::Service(back)) = decode_address(NAME, body) else {
        panic!("not a service");
    };
    let want = snap.services().find(|s| s.name == "web").unwrap();
    assert_eq!(back.http_routes, want.http_routes);
    assert_eq!(
        back.http_routes[1].redirect.as_deref(),
        Some(&RequestRedirect::default())
    );
    let address = wl::Address::decode(&body[..]).unwrap();
    let Some(wl::address::Type::Service(svc)) = address.r#type else {
        panic!("not a service");
    };
    assert_eq!(
        svc.ferry_http_routes[1]
            .redirect
            .as_ref()
            .map(|r| r.status_code),
        Some(302)
    );
    // The route without a redirect sends no field 8 (prost writes no unset message): the
    // bytes it sent before the field existed.
    assert_eq!(svc.ferry_http_routes[2].redirect, None);
}

fn with_redirect(r: wl::FerryRequestRedirect, matches: Vec<wl::FerryRouteMatch>) -> Vec<u8> {
    let route = wl::FerryHttpRoute {
        name: "r".into(),
        matches,
        redirect: Some(r),
        ..wl::FerryHttpRoute::default()
    };
    let svc = wl::Service {
        name: "web".into(),
        namespace: "default".into(),
        hostname: "web.default.svc.cluster.local".into(),
        ferry_http_routes: vec![route],
        ..wl::Service::default()
    };
    wl::Address {
        r#type: Some(wl::address::Type::Service(svc)),
    }
    .encode_to_vec()
}

#[test]
fn a_bad_redirect_is_rejected_naming_its_field() {
    use wl::ferry_request_redirect::Path;
    use wl::ferry_route_match::Path as MatchPath;
    let ok = wl::FerryRequestRedirect {
        status_code: 302,
        ..wl::FerryRequestRedirect::default()
    };
    let exact = wl::FerryRouteMatch {
        path: Some(MatchPath::PathExact("/a".into())),
        ..wl::FerryRouteMatch::default()
    };
    let backend = wl::FerryRouteBackend {
        service: NAME.into(),
        weight: 1,
        ..wl::FerryRouteBackend::default()
    };
    let cases: Vec<(wl::FerryRequestRedirect, Vec<wl::FerryRouteMatch>, &str)> = vec![
        (
            wl::FerryRequestRedirect {
                status_code: 307,
                ..ok.clone()
            },
            vec![],
            "ferry_http_routes[0]: redirect.status_code: expected 301 or 302, found 307",
        ),
        (
            wl::FerryRequestRedirect {
                status_code: 0,
                ..ok.clone()
            },
            vec![],
            "redirect.status_code: expected 301 or 302, found 0",
        ),
        (
            wl::FerryRequestRedirect {
                scheme: Some("ftp".into()),
                ..ok.clone()
            },
            vec![],
            "redirect.scheme: expected http or https, found \"ftp\"",
        ),
        (
            wl::FerryRequestRedirect {
                hostname: Some("evil\r\nset-cookie: x".into()),
                ..ok.clone()
            },
            vec![],
            "redirect.hostname: expected a DNS name",
        ),
        (
            wl::FerryRequestRedirect {
                port: Some(0),
                ..ok.clone()
            },
            vec![],
            "redirect.port: expected a port from 1 to 65535, found 0",
        ),
        (
            wl::FerryRequestRedirect {
                port: Some(70000),
                ..ok.clone()
            },
            vec![],
            "redirect.port: expected 1 to 65535, found 70000",
        ),
        (
            wl::FerryRequestRedirect {
                path: Some(Path::ReplaceFullPath("no-slash".into())),
                ..ok.clone()
            },
            vec![],
            "redirect.path.replace_full_path: expected a path starting with one '/'",
        ),
        (
            wl::FerryRequestRedirect {
                path: Some(Path::ReplaceFullPath("/a\r\nb".into())),
                ..ok.clone()
            },
            vec![],
            "redirect.path.replace_full_path: expected a path starting with one '/'",
        ),
        (
            wl::FerryRequestRedirect {
                path: Some(Path::ReplacePrefixMatch("/x".into())),
                ..ok.clone()
            },
            vec![exact],
            "redirect.path.replace_prefix_match: expected only path prefix matches, found an exact path in matches[0]",
        ),
    ];
    for (r, matches, why) in cases {
        let e = decode_address(NAME, &with_redirect(r, matches)).expect_err(why);
        assert!(e.to_string().contains(why), "{e} / {why}");
    }
    // Both a redirect and a backend: rejected.
    let mut both = wl::Address::decode(&with_redirect(ok, vec![])[..]).unwrap();
    let Some(wl::address::Type::Service(svc)) = &mut both.r#type else {
        unreachable!()
    };
    svc.ferry_http_routes[0].backends.push(backend);
    let e = decode_address(NAME, &both.encode_to_vec()).unwrap_err();
    assert!(
        e.to_string().contains("both a redirect and backends"),
        "{e}"
    );
}
