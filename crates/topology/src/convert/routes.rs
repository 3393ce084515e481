//! HTTP routes of services: resolved after every service is known, since a route may send
//! requests to a service declared further down.

use std::sync::Arc;

use ferry_core::model::{
    HTTP_METHODS, HeaderModifier, HttpRoute, PathMatch, RedirectPath, RedirectScheme,
    RequestRedirect, RouteBackend, RouteMatch, ServiceKey, StringMatch,
};

use super::{Cx, item, namespace, one_of};
use crate::schema::{HeaderModifierSpec, RedirectSpec, RouteMatchSpec, RouteSpec, ServiceSpec};

impl Cx {
    pub(super) fn routes(&mut self, specs: &[ServiceSpec]) {
        for (i, s) in specs.iter().enumerate() {
            if s.routes.is_empty() {
                continue;
            }
            let path = item("services", i, &s.name);
            let ns = namespace(s.namespace.as_ref());
            if s.waypoint.is_none() {
                self.problem(
                    format!("{path}.routes"),
                    "expected a `waypoint` on the service (its waypoint applies the routes), found none",
                );
            }
            let mut routes = Vec::new();
            let mut names = std::collections::BTreeSet::new();
            for (j, r) in s.routes.iter().enumerate() {
                let route_path = format!("{path}.{}", item("routes", j, &r.name));
                if r.name.is_empty() || !names.insert(r.name.clone()) {
                    self.problem(
                        format!("{route_path}.name"),
                        format!(
                            "expected a unique, non-empty route name, found {:?}",
                            r.name
                        ),
                    );
                }
                let parent_waypoint = self
                    .out
                    .services
                    .iter()
                    .find(|x| x.name == s.name && x.namespace == ns)
                    .and_then(|x| x.waypoint.clone());
                if let Some(route) = self.route(&route_path, &ns, r, parent_waypoint.as_ref()) {
                    routes.push(route);
                }
            }
            let Some(svc) = self
                .out
                .services
                .iter_mut()
                .find(|x| x.name == s.name && x.namespace == ns)
            else {
                continue;
            };
            svc.http_routes = routes;
        }
    }

    fn route(
        &mut self,
        path: &str,
        ns: &str,
        r: &RouteSpec,
        parent_waypoint: Option<&ferry_core::model::GatewayRef>,
    ) -> Option<HttpRoute> {
        let matches = r
            .matches
            .iter()
            .enumerate()
            .map(|(k, m)| self.route_match(&format!("{path}.match[{k}]"), m))
            .collect::<Vec<_>>();
        let redirect = r
            .redirect
            .as_ref()
            .and_then(|spec| self.redirect(&format!("{path}.redirect"), spec, &matches));
        if r.redirect.is_some() && !r.backends.is_empty() {
            self.problem(
                format!("{path}.backends"),
                "expected no backends on a route with a redirect (the two exclude each other), found some",
            );
        }
        if r.backends.is_empty() && r.redirect.is_none() {
            self.problem(
                format!("{path}.backends"),
                "expected at least one backend, found none",
            );
        }
        let mut backends = Vec::new();
        for (k, b) in r.backends.iter().enumerate() {
            let bpath = format!("{path}.backends[{k}]");
            let (bns, name) = match b.service.split_once('/') {
                Some((n, s)) => (n.to_string(), s),
                None => (ns.to_string(), b.service.as_str()),
            };
            let Some(svc) = self
                .out
                .services
                .iter()
                .find(|x| x.name == name && x.namespace == bns && x.waypoint_for.is_none())
            else {
                let known = self
                    .out
                    .services
                    .iter()
                    .filter(|x| x.waypoint_for.is_none())
                    .map(|x| format!("{}/{}", x.namespace, x.name));
                let expected = one_of("services", known);
                self.problem(
                    format!("{bpath}.service"),
                    format!("expected {expected}, found {:?}", b.service),
                );
                continue;
            };
            let key = ServiceKey::new(&svc.namespace, &svc.hostname);
            // The waypoint sends routed requests to endpoints, never through another waypoint.
            let other_waypoint = svc.waypoint.is_some() && svc.waypoint.as_ref() != parent_waypoint;
            let ports: Vec<u16> = svc.ports.iter().map(|p| p.port).collect();
            if let Some(port) = b.port
                && !ports.contains(&port)
            {
                self.problem(
                    format!("{bpath}.port"),
                    format!("expected a port of {} ({ports:?}), found {port}", b.service),
                );
            }
            if other_waypoint {
                self.problem(
                    format!("{bpath}.service"),
                    format!(
                        "expected a service without a waypoint of its own (or with this service's), found {:?}, served by another waypoint",
                        b.service
                    ),
                );
            }
            backends.push(RouteBackend {
                service: key,
                port: b.port,
                subset: b.subset.clone(),
                weight: b.weight,
            });
        }
        if !r.backends.is_empty() && r.backends.iter().all(|b| b.weight == 0) {
            self.problem(
                format!("{path}.backends"),
                "expected at least one backend with a weight above 0, found all 0",
            );
        }
        if r.retries > 10 {
            self.problem(
                format!("{path}.retries"),
                format!("expected at most 10 retries, found {}", r.retries),
            );
        }
        Some(HttpRoute {
            name: r.name.clone(),
            matches,
            backends,
            timeout_ms: r.timeout_ms.unwrap_or(0),
            retries: r.retries,
            request_headers: self
                .modifier(&format!("{path}.request_headers"), &r.request_headers)
                .into(),
            response_headers: self
                .modifier(&format!("{path}.response_headers"), &r.response_headers)
                .into(),
            redirect: redirect.map(Arc::new),
        })
    }

    /// The checked redirect (a problem naming the first bad field: none kept).
    fn redirect(
        &mut self,
        path: &str,
        r: &RedirectSpec,
        matches: &[RouteMatch],
    ) -> Option<RequestRedirect> {
        let scheme = match r.scheme.as_deref().map(|s| (s, RedirectScheme::parse(s))) {
            None => None,
            Some((_, Some(s))) => Some(s),
            Some((s, None)) => {
                self.problem(
                    format!("{path}.scheme"),
                    format!("expected http or https, found {s:?}"),
                );
                return None;
            }
        };
        let rpath = match (&r.replace_full_path, &r.replace_prefix_match) {
            (Some(_), Some(_)) => {
                self.problem(
                    path.to_string(),
                    "expected one of `replace_full_path` and `replace_prefix_match`, found both",
                );
                return None;
            }
            (Some(p), None) => Some(RedirectPath::Full(p.clone())),
            (None, Some(p)) => Some(RedirectPath::PrefixMatch(p.clone())),
            (None, None) => None,
        };
        let redirect = RequestRedirect {
            scheme,
            hostname: r.hostname.clone(),
            port: r.port,
            path: rpath,
            status: r.status.unwrap_or(302),
        };
        let checked = redirect
            .check()
            .and_then(|c| c.check_matches(matches).map(|()| c));
        match checked {
            Ok(c) => Some(c),
            Err(e) => {
                let field = match e.field.as_str() {
                    "path.replace_full_path" => "replace_full_path",
                    "path.replace_prefix_match" => "replace_prefix_match",
                    f => f,
                };
                self.problem(format!("{path}.{field}"), e.problem);
                None
            }
        }
    }

    /// Checked header edits (a problem for the first that no route may make: none kept).
    fn modifier(&mut self, path: &str, m: &HeaderModifierSpec) -> HeaderModifier {
        let pairs = |map: &std::collections::BTreeMap<String, String>| {
            map.iter().map(|(n, v)| (n.clone(), v.clone())).collect()
        };
        let spec = HeaderModifier {
            set: pairs(&m.set),
            add: pairs(&m.add),
            remove: m.remove.clone(),
        };
        match spec.check() {
            Ok(m) => m,
            Err(e) => {
                self.problem(format!("{path}.{}", e.field), e.problem);
                HeaderModifier::default()
            }
        }
    }

    fn route_match(&mut self, path: &str, m: &RouteMatchSpec) -> RouteMatch {
        let mut check = |field: &str, p: &str| {
            if !p.starts_with('/') {
                self.problem(
                    format!("{path}.{field}"),
                    format!("expected a path starting with /, found {p:?}"),
                );
            }
        };
        let path_match = match (&m.path, &m.path_prefix) {
            (Some(_), Some(_)) => {
                self.problem(
                    path.to_string(),
                    "expected one of `path` and `path_prefix`, found both",
                );
                None
            }
            (Some(p), None) => {
                check("path", p);
                Some(PathMatch::Exact(p.clone()))
            }
            (None, Some(p)) => {
                check("path_prefix", p);
                Some(PathMatch::Prefix(p.clone()))
            }
            (None, None) => None,
        };
        let mut headers = Vec::new();
        for (name, pattern) in &m.headers {
            if pattern.is_empty() {
                self.problem(
                    format!("{path}.headers.{name}"),
                    "expected a value, `prefix*`, `*suffix` or `*`, found \"\"",
                );
                continue;
            }
            headers.push((
                name.to_ascii_lowercase(),
                StringMatch::from_pattern(pattern),
            ));
        }
        if let Some(method) = &m.method
            && !HTTP_METHODS.contains(&method.as_str())
        {
            self.problem(
                format!("{path}.method"),
                format!(
                    "expected one of {}, found {method:?}",
                    HTTP_METHODS.join(", ")
                ),
            );
        }
        for name in m.query.keys().filter(|n| n.is_empty()) {
            self.problem(
                format!("{path}.query"),
                format!("expected a parameter name, found {name:?}"),
            );
        }
        RouteMatch {
            path: path_match,
            method: m.method.clone(),
            headers,
            query: m
                .query
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
        }
    }
}
