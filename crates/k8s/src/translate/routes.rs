//! Gateway API `HTTPRoute`s attached to a Service (`parentRefs` of kind `Service`, the GAMMA
//! way Istio's ambient mode reads them): each rule becomes one HTTP route of that service,
//! applied by its waypoint, in the order of the routes' names and then their rules.
//!
//! Read: `matches` with `path` (`Exact`, `PathPrefix`, the default) and `headers` (`Exact`, the
//! default), `backendRefs` to Services of the route's namespace with a `port` and a `weight`,
//! and `timeouts.request` in seconds or milliseconds (`"5s"`, `"500ms"`). A rule that uses
//! anything else (filters, method or query matches, regular expressions, a header value with
//! `*`, which Ferry would read as a pattern, a backend of another kind or namespace, a backend
//! Service that does not exist) is left out with a note, and its requests fall to the next
//! rule or to the service itself. A route on a Service without a waypoint does nothing (no
//! waypoint applies it) and is a note. A route of one name in several clusters is read from
//! the first cluster in ID order; a differing copy is a note.

use std::collections::BTreeMap;

use ferry_topology::schema::{BackendSpec, RouteMatchSpec, RouteSpec};

use super::{Tx, ns_name};
use crate::crd::{HttpRoute, HttpRouteRule};

impl Tx<'_> {
    pub(super) fn http_routes(&mut self) {
        // By (namespace, name): the first cluster's copy.
        let mut routes: BTreeMap<(String, String), (String, &HttpRoute)> = BTreeMap::new();
        for c in self.clusters.clone() {
            for r in &c.http_routes {
                let key = ns_name(&r.metadata);
                if let Some((first, _)) = routes.get(&key) {
                    let msg = format!("the copy of cluster {first} is used");
                    self.note(&c.cluster, format!("HTTPRoute {}/{}", key.0, key.1), msg);
                    continue;
                }
                routes.insert(key, (c.cluster.clone(), r));
            }
        }
        for ((ns, name), (cluster, r)) in routes {
            let object = format!("HTTPRoute {ns}/{name}");
            for parent in &r.spec.parent_refs {
                let is_service = parent.kind.as_deref() == Some("Service")
                    && parent
                        .group
                        .as_deref()
                        .is_none_or(|g| g.is_empty() || g == "core");
                if !is_service {
                    // Attached to a Gateway: an ingress route, not a waypoint's.
                    continue;
                }
                let parent_ns = parent.namespace.clone().unwrap_or_else(|| ns.clone());
                let Some(si) = self.file.services.iter().position(|s| {
                    s.name == parent.name
                        && s.namespace.as_deref() == Some(parent_ns.as_str())
                        && s.hostname.is_none()
                }) else {
                    let msg = format!(
                        "left out: no Service {parent_ns}/{} to attach to",
                        parent.name
                    );
                    self.note(&cluster, object.clone(), msg);
                    continue;
                };
                if self.file.services[si].waypoint.is_none() {
                    let msg = format!(
                        "does nothing: Service {parent_ns}/{} has no waypoint to apply it",
                        parent.name
                    );
                    self.note(&cluster, object.clone(), msg);
                    continue;
                }
                if parent.port.is_some() {
                    let msg = "its parentRef's port is not read: the rules apply to every HTTP port of the Service";
                    self.note(&cluster, object.clone(), msg);
                }
                for (i, rule) in r.spec.rules.iter().enumerate() {
                    match self.rule(&ns, &name, i, rule) {
                        Ok(spec) => self.file.services[si].routes.push(spec),
                        Err(why) => {
                            let msg = format!("rule {i} left out: {why}");
                            self.note(&cluster, object.clone(), msg);
                        }
                    }
                }
            }
        }
    }

    /// Rule `i` of route `ns/name`, or why Ferry cannot apply it as written.
    fn rule(
        &self,
        ns: &str,
        name: &str,
        i: usize,
        rule: &HttpRouteRule,
    ) -> Result<RouteSpec, String> {
        if let Some(field) = rule.other.keys().next() {
            return Err(format!("`{field}` is not applied by Ferry"));
        }
        let mut matches = Vec::new();
        for m in &rule.matches {
            if let Some(field) = m.other.keys().next() {
                return Err(format!("a match on `{field}` is not applied by Ferry"));
            }
            let mut spec = RouteMatchSpec::default();
            if let Some(p) = &m.path {
                let value = p.value.clone().unwrap_or_else(|| "/".into());
                match p.type_.as_deref().unwrap_or("PathPrefix") {
                    "Exact" => spec.path = Some(value),
                    "PathPrefix" => spec.path_prefix = Some(value),
                    other => return Err(format!("a path match of type {other}")),
                }
            }
            for h in &m.headers {
                if h.type_.as_deref().is_some_and(|t| t != "Exact") {
                    return Err(format!("a header match of type {:?}", h.type_));
                }
                if h.value.contains('*') {
                    return Err(format!("header {}'s value holds a `*`", h.name));
                }
                spec.headers
                    .insert(h.name.to_ascii_lowercase(), h.value.clone());
            }
            matches.push(spec);
        }
        let mut backends = Vec::new();
        for b in &rule.backend_refs {
            let kind_ok = b.kind.as_deref().is_none_or(|k| k == "Service")
                && b.group
                    .as_deref()
                    .is_none_or(|g| g.is_empty() || g == "core");
            if !kind_ok {
                return Err(format!("backend {} is not a Service", b.name));
            }
            if b.namespace.as_deref().is_some_and(|n| n != ns) {
                return Err(format!("backend {} is in another namespace", b.name));
            }
            if let Some(field) = b.other.keys().next() {
                return Err(format!(
                    "backend {}'s `{field}` is not applied by Ferry",
                    b.name
                ));
            }
            let exists = self.file.services.iter().any(|s| {
                s.name == b.name && s.namespace.as_deref() == Some(ns) && s.hostname.is_none()
            });
            if !exists {
                return Err(format!("backend Service {ns}/{} does not exist", b.name));
            }
            backends.push(BackendSpec {
                service: b.name.clone(),
                port: b.port,
                subset: BTreeMap::new(),
                weight: b.weight.unwrap_or(1),
            });
        }
        if backends.is_empty() {
            return Err("no backend (Gateway API answers such requests with 500)".into());
        }
        let timeout_ms = match rule.timeouts.as_ref() {
            None => None,
            Some(t) => {
                if let Some(other) = t.keys().find(|k| *k != "request") {
                    return Err(format!("timeout `{other}` is not applied by Ferry"));
                }
                match t.get("request") {
                    None => None,
                    Some(d) => Some(duration_ms(d).ok_or_else(|| {
                        format!("request timeout {d:?} is not whole seconds or milliseconds")
                    })?),
                }
            }
        };
        Ok(RouteSpec {
            name: format!("{name}.{i}"),
            matches,
            backends,
            timeout_ms,
            retries: 0,
        })
    }
}

/// `"5s"` or `"500ms"` in milliseconds.
fn duration_ms(d: &str) -> Option<u32> {
    if let Some(ms) = d.strip_suffix("ms") {
        return ms.parse().ok();
    }
    d.strip_suffix('s')?.parse::<u32>().ok()?.checked_mul(1000)
}
