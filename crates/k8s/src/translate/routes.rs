//! Gateway API `HTTPRoute`s attached to a Service (`parentRefs` of kind `Service`, the GAMMA
//! way Istio's ambient mode reads them): each match of each rule becomes one HTTP route of that
//! service (named `<route>.<rule>`, or `<route>.<rule>.<match>` for a rule of several matches),
//! applied by its waypoint, which takes the first route that matches. They are ordered as the
//! Gateway API orders matches across every route of the Service ([`Precedence`]): an `Exact`
//! path first, then the longest `PathPrefix` (a match without a path is the prefix `/`), then
//! a match with a `method` before one without, then the most header matches, then the most
//! query parameter matches; on a tie the oldest route (`creationTimestamp`), then
//! `<namespace>/<name>` in alphabetical order, then the first rule and match in list order.
//!
//! Read: `matches` with `path` (`Exact`, `PathPrefix`, the default), `method`, `headers`
//! (`Exact`, the default) and `queryParams` (`Exact`, the default: only the request's query is
//! percent-decoded, the name and value are compared as written; a repeated parameter by its
//! first value, among the query's first 256 parameters), `filters` of type
//! `RequestHeaderModifier` and `ResponseHeaderModifier` (`set`, `add`, `remove`; applied by the
//! waypoint after it authorized the request, as remove, then set, then add), `backendRefs` to
//! Services of the route's namespace with a `port` and a `weight`, and `timeouts.request` in
//! seconds or milliseconds (`"5s"`, `"500ms"`), or instead of `backendRefs` a `RequestRedirect`
//! filter (`scheme`, `hostname`, `port`, `path` of type `ReplaceFullPath` or
//! `ReplacePrefixMatch`, `statusCode` 301 or 302), which the waypoint answers itself once it
//! authorized the request; a rule with both, or whose redirect is invalid (another status, a
//! hostname that is no DNS name, port 0, a path not starting with `/`, CR or LF, a
//! `ReplacePrefixMatch` with an `Exact` path match), is left out with a note naming the field.
//! A rule that uses anything else (other filters,
//! regular expressions, a header value with `*`, which Ferry would read as a pattern, a header
//! edit of an invalid name or value, a pseudo-header, `host`, a connection-specific header
//! (`trailer` among them) or `content-length`, a backend of another kind or namespace, a
//! backend Service that does not exist) is left out with a note, and its requests fall to the
//! next rule or to the service itself. Of header names equal but for case (the API server lets
//! `X-Foo` and `x-foo` both through), in a match's `headers` and in each list of a header
//! modifier, the first entry counts and the others are ignored, unchecked, as the Gateway API
//! says (the topology file and the xDS decoder stay strict: two such names in one edit list are
//! refused). A route on a Service without a waypoint does nothing (no waypoint applies it) and
//! is a note. A route of one name in several clusters is read from the first cluster in ID
//! order; a differing copy is a note.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use ferry_core::model::{
    HTTP_METHODS, HeaderEditError, HeaderModifier, REDIRECT_STATUSES, RedirectPath, RedirectScheme,
    RequestRedirect,
};
use ferry_topology::schema::{
    BackendSpec, HeaderModifierSpec, RedirectSpec, RouteMatchSpec, RouteSpec,
};
use k8s_openapi::jiff::Timestamp;

use super::{Tx, ns_name};
use crate::crd::{HttpRoute, HttpRouteFilter, HttpRouteRule};

/// Where one match stands among every match of a Service's routes, as the Gateway API orders
/// them (the first in this order that matches a request takes it). Pure data, compared as a
/// tuple.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Precedence {
    /// 0 for an `Exact` path, 1 for a prefix (`PathPrefix`, or none: `/`).
    path_kind: u8,
    /// The prefix's length in characters, longest first.
    prefix_len: Reverse<usize>,
    /// A match with a method first.
    method: Reverse<bool>,
    /// The number of header matches, most first.
    headers: Reverse<usize>,
    /// The number of query parameter matches, most first.
    query: Reverse<usize>,
    /// The route's creation, oldest first (a route without one after every other).
    created: (bool, Option<Timestamp>),
    /// `(namespace, name)` of the route.
    route: (String, String),
    rule: usize,
    matched: usize,
}

impl Precedence {
    fn of(
        m: &RouteMatchSpec,
        created: Option<Timestamp>,
        route: (String, String),
        rule: usize,
        matched: usize,
    ) -> Self {
        let (path_kind, prefix_len) = match (&m.path, &m.path_prefix) {
            (Some(_), _) => (0, 0),
            (None, Some(p)) => (1, p.chars().count()),
            (None, None) => (1, 1),
        };
        Self {
            path_kind,
            prefix_len: Reverse(prefix_len),
            method: Reverse(m.method.is_some()),
            headers: Reverse(m.headers.len()),
            query: Reverse(m.query.len()),
            created: (created.is_none(), created),
            route,
            rule,
            matched,
        }
    }
}

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
        // By the index of the service they attach to: every match, with where it stands.
        let mut attached: BTreeMap<usize, Vec<(Precedence, RouteSpec)>> = BTreeMap::new();
        for ((ns, name), (cluster, r)) in routes {
            let object = format!("HTTPRoute {ns}/{name}");
            let created = r.metadata.creation_timestamp.as_ref().map(|t| t.0);
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
                        Ok(spec) => {
                            let per_match = split(spec, |j, m| {
                                Precedence::of(m, created, (ns.clone(), name.clone()), i, j)
                            });
                            attached.entry(si).or_default().extend(per_match);
                        }
                        Err(why) => {
                            let msg = format!("rule {i} left out: {why}");
                            self.note(&cluster, object.clone(), msg);
                        }
                    }
                }
            }
        }
        for (si, mut routes) in attached {
            routes.sort_by(|a, b| a.0.cmp(&b.0));
            self.file.services[si]
                .routes
                .extend(routes.into_iter().map(|(_, r)| r));
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
                let name = h.name.to_ascii_lowercase();
                // Header names are case-insensitive and only the first entry of a name counts
                // (the Gateway API's rule); the API server's uniqueness is case-sensitive, so
                // `X-Foo` and `x-foo` can both arrive: the later one is ignored.
                if spec.headers.contains_key(&name) {
                    continue;
                }
                if h.type_.as_deref().is_some_and(|t| t != "Exact") {
                    return Err(format!("a header match of type {:?}", h.type_));
                }
                if h.value.contains('*') {
                    return Err(format!("header {}'s value holds a `*`", h.name));
                }
                spec.headers.insert(name, h.value.clone());
            }
            if let Some(method) = &m.method {
                if !HTTP_METHODS.contains(&method.as_str()) {
                    return Err(format!("a match on method {method:?}"));
                }
                spec.method = Some(method.clone());
            }
            for q in &m.query_params {
                if let Some(t) = q.type_.as_deref().filter(|t| *t != "Exact") {
                    return Err(format!("a query parameter match of type {t}"));
                }
                if q.name.is_empty() {
                    return Err("a query parameter match without a name".into());
                }
                // A name given again is ignored: the Gateway API considers only the first.
                spec.query
                    .entry(q.name.clone())
                    .or_insert_with(|| q.value.clone());
            }
            matches.push(spec);
        }
        let (request_headers, response_headers, redirect) = header_filters(&rule.filters)?;
        if let Some(r) = &redirect {
            if !rule.backend_refs.is_empty() {
                return Err(
                    "a RequestRedirect filter with backendRefs (the Gateway API makes them exclusive)"
                        .into(),
                );
            }
            if r.replace_prefix_match.is_some()
                && let Some(j) = matches.iter().position(|m| m.path.is_some())
            {
                return Err(format!(
                    "requestRedirect.path.replacePrefixMatch: expected only PathPrefix matches, found an Exact path in matches[{j}]"
                ));
            }
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
        if backends.is_empty() && redirect.is_none() {
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
            request_headers,
            response_headers,
            redirect,
        })
    }
}

/// A rule's `RequestHeaderModifier`, `ResponseHeaderModifier` and `RequestRedirect` filters,
/// checked as every decoder checks them; any other filter, or one of these twice, is why the
/// rule is left out.
fn header_filters(filters: &[HttpRouteFilter]) -> Result<Filters, String> {
    let (mut request, mut response, mut redirect) = (None, None, None);
    for f in filters {
        if f.type_ == "RequestRedirect" {
            if let Some(key) = f.other.keys().next() {
                return Err(format!(
                    "filter RequestRedirect's `{key}` is not applied by Ferry"
                ));
            }
            let Some(given) = &f.request_redirect else {
                return Err("filter RequestRedirect without `requestRedirect`".into());
            };
            if redirect.is_some() {
                return Err("filter RequestRedirect is given twice".into());
            }
            redirect = Some(redirect_filter(given).map_err(|e| format!("requestRedirect.{e}"))?);
            continue;
        }
        let (slot, given, field) = match f.type_.as_str() {
            "RequestHeaderModifier" => (
                &mut request,
                f.request_header_modifier.as_ref(),
                "requestHeaderModifier",
            ),
            "ResponseHeaderModifier" => (
                &mut response,
                f.response_header_modifier.as_ref(),
                "responseHeaderModifier",
            ),
            other => return Err(format!("a filter of type {other} is not applied by Ferry")),
        };
        if let Some(key) = f.other.keys().next() {
            return Err(format!(
                "filter {}'s `{key}` is not applied by Ferry",
                f.type_
            ));
        }
        let Some(given) = given else {
            return Err(format!("filter {} without `{field}`", f.type_));
        };
        if let Some(key) = given.other.keys().next() {
            return Err(format!("{field}.{key} is not applied by Ferry"));
        }
        if slot.is_some() {
            return Err(format!("filter {} is given twice", f.type_));
        }
        // Header names are case-insensitive and the API server's uniqueness is not: of names
        // equal but for case, the first entry counts and the others are ignored.
        let (set, set_at) = first_of_each_name(&given.set, |h| &h.name);
        let (add, add_at) = first_of_each_name(&given.add, |h| &h.name);
        let (remove, remove_at) = first_of_each_name(&given.remove, |n| n);
        let pairs = |list: Vec<&crate::crd::HttpHeader>| {
            list.into_iter()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect()
        };
        let checked = HeaderModifier {
            set: pairs(set),
            add: pairs(add),
            remove: remove.into_iter().cloned().collect(),
        }
        .check()
        .map_err(|e| {
            let e = placed_as_given(
                e,
                &[("set", &set_at), ("add", &add_at), ("remove", &remove_at)],
            );
            format!("{field}.{e}")
        })?;
        // Checked: names in lower case, each once per list, so the maps keep every edit.
        *slot = Some(HeaderModifierSpec {
            set: checked.set.into_iter().collect(),
            add: checked.add.into_iter().collect(),
            remove: checked.remove,
        });
    }
    Ok((
        request.unwrap_or_default(),
        response.unwrap_or_default(),
        redirect,
    ))
}

/// A rule's request edits, response edits and redirect.
type Filters = (HeaderModifierSpec, HeaderModifierSpec, Option<RedirectSpec>);

/// A `requestRedirect`, checked as every decoder checks it; an error starts with its field as
/// the object names it (`statusCode: ...`).
fn redirect_filter(r: &crate::crd::RedirectFilter) -> Result<RedirectSpec, String> {
    if let Some(key) = r.other.keys().next() {
        return Err(format!("{key} is not applied by Ferry"));
    }
    let scheme = match r.scheme.as_deref() {
        None => None,
        Some(s) => Some(
            RedirectScheme::parse(s)
                .ok_or_else(|| format!("scheme: expected http or https, found {s:?}"))?,
        ),
    };
    let port = match r.port {
        None => None,
        Some(p) => Some(
            u16::try_from(p)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("port: expected a port from 1 to 65535, found {p}"))?,
        ),
    };
    let status = match r.status_code {
        None => 302,
        Some(s) => u16::try_from(s)
            .ok()
            .filter(|s| REDIRECT_STATUSES.contains(s))
            .ok_or_else(|| format!("statusCode: expected 301 or 302, found {s}"))?,
    };
    let path = match &r.path {
        None => None,
        Some(p) => {
            if let Some(key) = p.other.keys().next() {
                return Err(format!("path.{key} is not applied by Ferry"));
            }
            let given = |v: &Option<String>, field: &str| {
                v.clone()
                    .ok_or_else(|| format!("path: type {} without `{field}`", p.type_))
            };
            match p.type_.as_str() {
                "ReplaceFullPath" => Some(RedirectPath::Full(given(
                    &p.replace_full_path,
                    "replaceFullPath",
                )?)),
                "ReplacePrefixMatch" => Some(RedirectPath::PrefixMatch(given(
                    &p.replace_prefix_match,
                    "replacePrefixMatch",
                )?)),
                other => return Err(format!("path: a path modifier of type {other:?}")),
            }
        }
    };
    let checked = RequestRedirect {
        scheme,
        hostname: r.hostname.clone(),
        port,
        path,
        status,
    }
    .check()
    .map_err(|e| {
        let field = match e.field.as_str() {
            "path.replace_full_path" => "path.replaceFullPath",
            "path.replace_prefix_match" => "path.replacePrefixMatch",
            "status" => "statusCode",
            f => f,
        };
        format!("{field}: {}", e.problem)
    })?;
    let (replace_full_path, replace_prefix_match) = match checked.path {
        None => (None, None),
        Some(RedirectPath::Full(p)) => (Some(p), None),
        Some(RedirectPath::PrefixMatch(p)) => (None, Some(p)),
    };
    Ok(RedirectSpec {
        scheme: checked.scheme.map(|s| s.as_str().to_string()),
        hostname: checked.hostname,
        port: checked.port,
        replace_full_path,
        replace_prefix_match,
        status: Some(checked.status),
    })
}

/// The entries of `list` whose name no earlier entry gave (compared ignoring ASCII case),
/// with their places in `list`.
fn first_of_each_name<T>(list: &[T], name: impl Fn(&T) -> &str) -> (Vec<&T>, Vec<usize>) {
    let mut seen = std::collections::BTreeSet::new();
    list.iter()
        .enumerate()
        .filter(|(_, e)| seen.insert(name(e).to_ascii_lowercase()))
        .map(|(i, e)| (e, i))
        .unzip()
}

/// `e`, placed (`set[1]`) in the lists as the object gave them rather than as checked, once
/// ignored entries were dropped: `lists` holds each list's places.
fn placed_as_given(e: HeaderEditError, lists: &[(&str, &[usize])]) -> HeaderEditError {
    let given = lists.iter().find_map(|(list, at)| {
        let rest = e.field.strip_prefix(list)?.strip_prefix('[')?;
        let (i, rest) = rest.split_once(']')?;
        let place = at.get(i.parse::<usize>().ok()?)?;
        Some(format!("{list}[{place}]{rest}"))
    });
    HeaderEditError {
        field: given.unwrap_or(e.field),
        problem: e.problem,
    }
}

/// One route per match of `spec` (a rule without matches is one route that matches every
/// request, as the prefix `/`), each with its precedence: `<route>.<rule>` keeps its name when
/// it has at most one match, else each becomes `<route>.<rule>.<match>`.
fn split(
    spec: RouteSpec,
    precedence: impl Fn(usize, &RouteMatchSpec) -> Precedence,
) -> Vec<(Precedence, RouteSpec)> {
    if spec.matches.len() <= 1 {
        let p = precedence(
            0,
            spec.matches.first().unwrap_or(&RouteMatchSpec::default()),
        );
        return vec![(p, spec)];
    }
    let RouteSpec {
        name,
        matches,
        backends,
        timeout_ms,
        retries,
        request_headers,
        response_headers,
        redirect,
    } = spec;
    matches
        .into_iter()
        .enumerate()
        .map(|(j, m)| {
            let route = RouteSpec {
                name: format!("{name}.{j}"),
                matches: Vec::new(),
                backends: backends
                    .iter()
                    .map(|b| BackendSpec {
                        service: b.service.clone(),
                        port: b.port,
                        subset: b.subset.clone(),
                        weight: b.weight,
                    })
                    .collect(),
                timeout_ms,
                retries,
                request_headers: request_headers.clone(),
                response_headers: response_headers.clone(),
                redirect: redirect.clone(),
            };
            (
                precedence(j, &m),
                RouteSpec {
                    matches: vec![m],
                    ..route
                },
            )
        })
        .collect()
}

/// `"5s"` or `"500ms"` in milliseconds.
fn duration_ms(d: &str) -> Option<u32> {
    if let Some(ms) = d.strip_suffix("ms") {
        return ms.parse().ok();
    }
    d.strip_suffix('s')?.parse::<u32>().ok()?.checked_mul(1000)
}
