//! Which HTTP route a request takes and which backend it goes to: pure, no I/O. The waypoint
//! then decides the backend's endpoint with [`super::route_within`], inside both the backend's
//! and the routed service's scope.

use std::borrow::Cow;

use crate::authz::HttpRequest;
use crate::model::{HttpRoute, RouteBackend, RouteMatch};
use crate::random::Random;

/// How many of a query's parameters (its non-empty `&`-separated pairs, from the start) route
/// matching reads: a parameter after them is not seen, and a condition naming only it does not
/// hold. It bounds the decoding one request costs, however long its query.
pub const QUERY_PARAMETERS_READ: usize = 256;

/// The first route whose matches admit the request (a route without matches admits all).
/// The query is read at most once, and only when some match compares a parameter.
pub fn select<'r>(routes: &'r [HttpRoute], req: &HttpRequest<'_>) -> Option<&'r HttpRoute> {
    let mut query = Query::new(req.query);
    routes
        .iter()
        .find(|r| r.matches.is_empty() || r.matches.iter().any(|m| holds(m, req, &mut query)))
}

/// The first of `route`'s matches that admits the request (`None` when none does, or the route
/// has none): which `PathPrefix` a redirect's `ReplacePrefixMatch` replaces.
pub fn holding<'r>(route: &'r HttpRoute, req: &HttpRequest<'_>) -> Option<&'r RouteMatch> {
    let mut query = Query::new(req.query);
    route.matches.iter().find(|m| holds(m, req, &mut query))
}

/// Does one match admit the request? Every condition must hold; a header condition holds when
/// any value of that header satisfies it; a query condition holds when the first parameter of
/// that name (the request's names and values percent-decoded, `+` as a space, among its first
/// [`QUERY_PARAMETERS_READ`] parameters) has exactly that value. [`select`] reads the query
/// once for all its routes; this reads it again for each call.
pub fn matches(m: &RouteMatch, req: &HttpRequest<'_>) -> bool {
    holds(m, req, &mut Query::new(req.query))
}

fn holds<'q>(m: &RouteMatch, req: &HttpRequest<'q>, query: &mut Query<'q>) -> bool {
    if let Some(p) = &m.path
        && !p.matches(req.path)
    {
        return false;
    }
    if let Some(method) = &m.method
        && req.method != method
    {
        return false;
    }
    let headers_hold = m.headers.iter().all(|(name, want)| {
        req.headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case(name) && want.matches(v))
    });
    headers_hold
        && (m.query.is_empty() || {
            let params = query.read();
            m.query
                .iter()
                .all(|(name, want)| params.first(name) == Some(want.as_str()))
        })
}

/// A request's query, read when a match first compares a parameter, then kept for the
/// request's other matches.
struct Query<'q> {
    raw: &'q str,
    read: Option<Params<'q>>,
}

impl<'q> Query<'q> {
    fn new(raw: &'q str) -> Self {
        Self { raw, read: None }
    }

    fn read(&mut self) -> &Params<'q> {
        let raw = self.raw;
        self.read.get_or_insert_with(|| Params::read(raw))
    }
}

/// The first [`QUERY_PARAMETERS_READ`] parameters of a query, decoded, in order. Held on the
/// stack and borrowing the query: a parameter without escapes costs no allocation, one with
/// escapes one string for its name or value.
struct Params<'q> {
    len: usize,
    pairs: [(Cow<'q, str>, Cow<'q, str>); QUERY_PARAMETERS_READ],
}

impl<'q> Params<'q> {
    fn read(raw: &'q str) -> Self {
        let mut pairs = std::array::from_fn(|_| (Cow::Borrowed(""), Cow::Borrowed("")));
        let mut len = 0;
        // `zip` stops at the last slot before asking the parser for one more parameter.
        for (slot, pair) in pairs.iter_mut().zip(form_urlencoded::parse(raw.as_bytes())) {
            *slot = pair;
            len += 1;
        }
        Self { len, pairs }
    }

    /// The value of the first parameter named `name`.
    fn first(&self, name: &str) -> Option<&str> {
        self.pairs[..self.len]
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| &**v)
    }
}

/// One backend, with probability weight / total weight. `None` when no backend has weight.
pub fn pick_backend<'r>(route: &'r HttpRoute, rng: &mut dyn Random) -> Option<&'r RouteBackend> {
    let total: u64 = route.backends.iter().map(|b| u64::from(b.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut at = rng.below(total);
    for b in &route.backends {
        let w = u64::from(b.weight);
        if at < w {
            return Some(b);
        }
        at -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{PathMatch, ServiceKey, StringMatch};
    use crate::random::SplitMix64;

    fn backend(name: &str, weight: u32) -> RouteBackend {
        RouteBackend {
            service: ServiceKey::new("default", name),
            port: None,
            subset: BTreeMap::new(),
            weight,
        }
    }

    fn route(name: &str, matches: Vec<RouteMatch>, backends: Vec<RouteBackend>) -> HttpRoute {
        HttpRoute {
            name: name.into(),
            matches,
            backends,
            timeout_ms: 0,
            retries: 0,
            request_headers: Default::default(),
            response_headers: Default::default(),
            redirect: None,
        }
    }

    fn req<'a>(path: &'a str, headers: &'a [(&'a str, &'a str)]) -> HttpRequest<'a> {
        HttpRequest {
            method: "GET",
            path,
            query: "",
            host: "h",
            headers,
        }
    }

    fn call<'a>(method: &'a str, path: &'a str, query: &'a str) -> HttpRequest<'a> {
        HttpRequest {
            method,
            path,
            query,
            host: "h",
            headers: &[],
        }
    }

    #[test]
    fn the_method_matches_exactly_and_case_sensitively() {
        let m = RouteMatch {
            method: Some("GET".into()),
            ..RouteMatch::default()
        };
        assert!(matches(&m, &call("GET", "/", "")));
        assert!(!matches(&m, &call("get", "/", "")));
        assert!(!matches(&m, &call("POST", "/", "")));
        let routes = vec![
            route(
                "posts",
                vec![RouteMatch {
                    method: Some("POST".into()),
                    path: Some(PathMatch::Prefix("/orders".into())),
                    ..RouteMatch::default()
                }],
                vec![backend("w", 1)],
            ),
            route("rest", vec![], vec![backend("r", 1)]),
        ];
        let name = |m, p| select(&routes, &call(m, p, "")).map(|r| &r.name[..]);
        assert_eq!(name("POST", "/orders/1"), Some("posts"));
        assert_eq!(name("GET", "/orders/1"), Some("rest"));
        assert_eq!(name("POST", "/other"), Some("rest"));
    }

    #[test]
    fn query_parameters_match_decoded_exactly_on_their_first_value() {
        let m = RouteMatch {
            query: vec![("v".into(), "2".into()), ("q".into(), "a b/c".into())],
            ..RouteMatch::default()
        };
        let holds = |q| matches(&m, &call("GET", "/", q));
        assert!(holds("v=2&q=a%20b%2Fc"));
        assert!(
            holds("q=a+b/c&x=1&v=2"),
            "+ is a space, order does not matter"
        );
        assert!(holds("%76=2&q=a%20b%2fc"), "names are decoded too");
        assert!(!holds("v=2"), "every parameter must hold");
        assert!(!holds("v=2&q=a%20b%2Fc%20"), "values match exactly");
        assert!(!holds("V=2&q=a%20b%2Fc"), "names are case-sensitive");
        assert!(!holds("v=3&v=2&q=a%20b%2Fc"), "the first value decides");
        assert!(holds("v=2&v=3&q=a%20b%2Fc"));
        assert!(!holds(""));
        // Bad escapes are kept as they are, never a panic.
        assert!(!holds("v=%zz&q=%"));
        let empty = RouteMatch {
            query: vec![("flag".into(), String::new())],
            ..RouteMatch::default()
        };
        assert!(matches(&empty, &call("GET", "/", "flag")));
        assert!(matches(&empty, &call("GET", "/", "flag=")));
        assert!(!matches(&empty, &call("GET", "/", "flags")));
    }

    #[test]
    fn only_the_first_parameters_of_a_query_are_read() {
        let m = RouteMatch {
            query: vec![("v".into(), "2".into())],
            ..RouteMatch::default()
        };
        let filler = |n: usize| vec!["x=%31"; n].join("&");
        let last_read = format!("{}&v=2", filler(QUERY_PARAMETERS_READ - 1));
        assert!(matches(&m, &call("GET", "/", &last_read)));
        let beyond = format!("{}&v=2", filler(QUERY_PARAMETERS_READ));
        assert!(!matches(&m, &call("GET", "/", &beyond)), "not read");
        // Empty pairs are no parameters and count for nothing.
        let empties = format!("{}&&&v=2", filler(QUERY_PARAMETERS_READ - 1));
        assert!(matches(&m, &call("GET", "/", &empties)));
        let routes = vec![
            route("other", vec![m], vec![backend("o", 1)]),
            route(
                "flag",
                vec![RouteMatch {
                    query: vec![("flag".into(), String::new())],
                    ..RouteMatch::default()
                }],
                vec![backend("f", 1)],
            ),
        ];
        let name = |q: &str| select(&routes, &call("GET", "/", q)).map(|r| &r.name[..]);
        assert_eq!(
            name("v=3&flag"),
            Some("flag"),
            "one reading serves every route"
        );
        assert_eq!(name(&format!("{beyond}&flag")), None);
    }

    #[test]
    fn first_matching_route_wins_and_prefix_is_segment_wise() {
        let routes = vec![
            route(
                "v2",
                vec![RouteMatch {
                    path: Some(PathMatch::Prefix("/v2/".into())),
                    ..RouteMatch::default()
                }],
                vec![backend("b", 1)],
            ),
            route(
                "canary",
                vec![RouteMatch {
                    headers: vec![("x-canary".into(), StringMatch::Exact("yes".into()))],
                    ..RouteMatch::default()
                }],
                vec![backend("c", 1)],
            ),
            route("rest", vec![], vec![backend("a", 1)]),
        ];
        let name = |path, h: &[(&str, &str)]| select(&routes, &req(path, h)).map(|r| &r.name[..]);
        assert_eq!(name("/v2", &[]), Some("v2"));
        assert_eq!(name("/v2/x", &[("x-canary", "yes")]), Some("v2"));
        assert_eq!(name("/v20", &[]), Some("rest"));
        assert_eq!(name("/v20", &[("X-Canary", "yes")]), Some("canary"));
        assert_eq!(
            name("/", &[("x-canary", "no"), ("x-canary", "yes")]),
            Some("canary")
        );
        assert_eq!(name("/", &[("x-canary", "no")]), Some("rest"));
        assert_eq!(select(&routes[..2], &req("/", &[])), None);
    }

    #[test]
    fn exact_path_and_every_header_must_hold() {
        let m = RouteMatch {
            path: Some(PathMatch::Exact("/a".into())),
            headers: vec![
                ("x-a".into(), StringMatch::Presence),
                ("x-b".into(), StringMatch::Prefix("p".into())),
            ],
            ..RouteMatch::default()
        };
        assert!(matches(&m, &req("/a", &[("x-a", "1"), ("x-b", "pq")])));
        assert!(!matches(&m, &req("/a/", &[("x-a", "1"), ("x-b", "pq")])));
        assert!(!matches(&m, &req("/a", &[("x-a", "1")])));
        assert!(!matches(&m, &req("/a", &[("x-b", "pq")])));
    }

    #[test]
    fn weights_give_shares_and_zero_weight_is_never_picked() {
        let r = route(
            "split",
            vec![],
            vec![backend("a", 80), backend("z", 0), backend("b", 20)],
        );
        let mut rng = SplitMix64::new(42);
        let mut a = 0;
        for _ in 0..10_000 {
            match &pick_backend(&r, &mut rng).unwrap().service.hostname[..] {
                "a" => a += 1,
                "b" => {}
                other => panic!("picked {other}"),
            }
        }
        assert!((7_700..8_300).contains(&a), "a got {a} of 10000");
        let none = route("none", vec![], vec![backend("z", 0)]);
        assert!(pick_backend(&none, &mut rng).is_none());
    }
}
