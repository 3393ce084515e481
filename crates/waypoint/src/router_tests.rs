//! The waypoint's router on a real snapshot: a request is authorized as the client sent it,
//! whatever header edits the route it takes would make. The edits travel in the choice, which
//! `upstream::forward` applies only once `decide` returned (tests/route_filters.rs proves that
//! order over sockets).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::authz::HttpRequest;
use ferry_core::identity::Identity;
use ferry_core::model::{
    Action, Clause, HeaderMatch, HeaderModifier, HttpRoute, Match, PathMatch, Policy, PolicyScope,
    RedirectPath, RequestRedirect, RouteBackend, RouteMatch, Rule, StringMatch, WaypointFor,
};
use ferry_core::random::SplitMix64;
use ferry_core::store::Store;
use ferry_core::testing::{MeshBuilder, key, waypoint_ref};
use ferry_hbone::pool::{Pool, PoolConfig};
use ferry_tls::ca_client::{CertificateSource, FetchError};
use ferry_tls::certs::{CertManager, ManagerConfig};
use ferry_tls::config::Credentials;
use ferry_tls::testkit::TestCa;
use parking_lot::Mutex;

use super::*;
use crate::state::{Onward, Waypoint};

struct Signer(Arc<TestCa>);

impl CertificateSource for Signer {
    fn sign<'a>(
        &'a self,
        identity: &'a Identity,
        _lifetime: Duration,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Credentials, FetchError>> + Send + 'a>>
    {
        let creds = self.0.issue(identity);
        Box::pin(async move { Ok(creds) })
    }
}

/// `policy` with one rule per match.
fn policy(name: &str, action: Action, matches: Vec<Match>) -> Policy {
    Policy {
        name: name.into(),
        namespace: "default".into(),
        scope: PolicyScope::Namespace,
        action,
        rules: matches
            .into_iter()
            .map(|m| Rule {
                clauses: vec![Clause { matches: vec![m] }],
            })
            .collect(),
        dry_run: false,
    }
}

/// The router of a tunnel to `shop`, whose waypoint `wp` applies its route `admin` (which sets
/// `x-user: alice` and removes `x-block`), under two policies of its namespace: DENY when
/// `x-block` is present; ALLOW `x-user: alice`, or any path outside `/admin`.
pub(super) fn router() -> TunnelRouter {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east");
    m.node("east-1", "east", "us-east/a/r1");
    m.waypoint("wp", WaypointFor::Service);
    m.waypoint_pod("wp", "wp-1", "east-1", "198.18.1.50");
    m.pod("shop-1", "east-1", "198.18.1.10");
    let shop = m.service("shop", &[("net-east", "198.18.100.3")], 80, 8080);
    shop.waypoint = Some(waypoint_ref("wp"));
    shop.http_routes = vec![HttpRoute {
        name: "admin".into(),
        matches: vec![RouteMatch {
            path: Some(PathMatch::Prefix("/admin".into())),
            ..RouteMatch::default()
        }],
        backends: vec![RouteBackend {
            service: key("shop"),
            port: None,
            subset: BTreeMap::new(),
            weight: 1,
        }],
        timeout_ms: 0,
        retries: 0,
        request_headers: HeaderModifier {
            set: vec![("x-user".into(), "alice".into())],
            remove: vec!["x-block".into()],
            ..HeaderModifier::default()
        }
        .into(),
        response_headers: Default::default(),
        redirect: None,
    }];
    // Redirects, answered by the waypoint once the policies above allowed the request.
    let redirect = |name: &str, path: PathMatch, r: RequestRedirect| HttpRoute {
        name: name.into(),
        matches: vec![RouteMatch {
            path: Some(path),
            ..RouteMatch::default()
        }],
        backends: Vec::new(),
        timeout_ms: 0,
        retries: 0,
        request_headers: Default::default(),
        response_headers: HeaderModifier {
            set: vec![("x-route".into(), name.into())],
            ..HeaderModifier::default()
        }
        .into(),
        redirect: Some(Arc::new(r)),
    };
    shop.http_routes.push(redirect(
        "moved",
        PathMatch::Prefix("/old".into()),
        RequestRedirect {
            path: Some(RedirectPath::PrefixMatch("/new".into())),
            status: 301,
            ..RequestRedirect::default()
        },
    ));
    shop.http_routes.push(redirect(
        "login",
        PathMatch::Exact("/login".into()),
        RequestRedirect {
            scheme: Some(RedirectScheme::Https),
            hostname: Some("login.example".into()),
            ..RequestRedirect::default()
        },
    ));
    m.backs("shop-1", "shop");
    let header = |name: &str, value: StringMatch| Match {
        headers: vec![HeaderMatch {
            name: name.into(),
            values: vec![value],
        }],
        ..Match::default()
    };
    m.policy(policy(
        "deny-blocked",
        Action::Deny,
        vec![header("x-block", StringMatch::Presence)],
    ));
    let outside_admin = Match {
        not_paths: vec![StringMatch::Prefix("/admin".into())],
        ..Match::default()
    };
    m.policy(policy(
        "allow-alice",
        Action::Allow,
        vec![
            header("x-user", StringMatch::Exact("alice".into())),
            outside_admin,
        ],
    ));
    let snap = m.build();
    let me = snap
        .workloads()
        .find(|w| w.name == "wp-1")
        .expect("the waypoint pod")
        .clone();
    let ca = Arc::new(TestCa::new("root"));
    let mut registry = prometheus_client::registry::Registry::default();
    let (_, drain) = ferry_runtime::drain::new();
    let (_, changes) = tokio::sync::watch::channel(0u64);
    let wp = Arc::new_cyclic(|this| Waypoint {
        store: Arc::new(Store::new(snap)),
        certs: CertManager::new(Arc::new(Signer(ca.clone())), ManagerConfig::default()),
        pool: Pool::new(PoolConfig::default()),
        bundle: ca.bundle(),
        uid: me.uid.clone(),
        identity: me.identity().unwrap(),
        addresses: me.addresses.clone(),
        cluster: me.cluster.clone(),
        network: me.network.clone(),
        metrics: Arc::new(crate::metrics::RequestMetrics::new(&mut registry)),
        netns: None,
        changes,
        finish: drain.finish_signal(),
        acceptor: Arc::new(ferry_runtime::accept::Acceptor::new(&mut registry)),
        this: this.clone(),
    });
    TunnelRouter {
        wp,
        target: Destination::Host {
            hostname: "shop.default.svc.cluster.local".into(),
            port: 80,
        },
        service: Some((key("shop"), 80)),
        origin: "east".into(),
        baggage: Onward {
            baggage: Vec::new(),
            traceparent: None,
        },
        peer: None,
        source: Some(
            "spiffe://cluster.local/ns/default/sa/sleep"
                .parse()
                .unwrap(),
        ),
        source_ip: "198.18.1.20".parse().unwrap(),
        rng: Mutex::new(SplitMix64::new(7)),
    }
}

fn get<'a>(path: &'a str, headers: &'a [(&'a str, &'a str)]) -> HttpRequest<'a> {
    HttpRequest {
        method: "GET",
        path,
        query: "",
        host: "shop.default.svc.cluster.local",
        headers,
    }
}

#[tokio::test]
async fn a_request_is_authorized_as_sent_whatever_its_route_would_edit() {
    let r = router();
    let denied = |req: &HttpRequest<'_>| match r.decide(req, &[]) {
        Err(Refused::Denied(_)) => true,
        Err(Refused::Unroutable(why)) => panic!("not routed: {why}"),
        Ok(_) => false,
    };
    // The route would set `x-user: alice`: without it, the request is still denied.
    assert!(denied(&get("/admin/users", &[])));
    // The route would remove `x-block`: with it, the request is still denied.
    assert!(denied(&get(
        "/admin/users",
        &[("x-user", "alice"), ("x-block", "1")]
    )));
    // As sent, allowed: the choice carries the route's edits, for `forward` to apply.
    let choice = r
        .decide(&get("/admin/users", &[("x-user", "alice")]), &[])
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(choice.route.as_deref(), Some("admin"));
    assert_eq!(
        choice.headers.request.set,
        [("x-user".to_string(), "alice".to_string())]
    );
    assert_eq!(choice.headers.request.remove, ["x-block"]);
    // The edits are the route's own, shared, not a copy per request.
    let again = r
        .decide(&get("/admin/users", &[("x-user", "alice")]), &[])
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(Arc::ptr_eq(&choice.headers.request, &again.headers.request));
    assert!(Arc::ptr_eq(
        &choice.headers.response,
        &again.headers.response
    ));
    // Outside /admin no route matches, and the policy allows it without `x-user`.
    let plain = r
        .decide(&get("/shop", &[]), &[])
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(plain.route, None);
    assert!(plain.headers.request.is_empty());
    let plain_again = r
        .decide(&get("/shop", &[]), &[])
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(Arc::ptr_eq(
        &plain.headers.request,
        &plain_again.headers.request
    ));
}
