//! The waypoint's per-request decisions: the service's HTTP route (match, weighted backend,
//! subset), then the backend's endpoint, chosen anew for every request on behalf of the original
//! source's cluster, inside both the backend's and the routed service's scope, then the policy
//! of the endpoint it lands on.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::authz::HttpRequest;
use ferry_core::identity::Identity;
use ferry_core::model::{ClusterId, RedirectRequest, RedirectScheme, ServiceKey};
use ferry_core::random::SplitMix64;
use ferry_core::route::{self, Destination, Plan, Source, Transport, Within};
use ferry_runtime::conn::{ConnError, Denial};
use parking_lot::Mutex;

use crate::judge::Judge;
use crate::l7::{Choice, Link, Recheck, Refused, Router};
use crate::state::Waypoint;

/// How often a request's endpoint is drawn again to avoid one that already failed it.
const REDRAWS: usize = 4;

/// Decides the requests of one tunnel.
pub(crate) struct TunnelRouter {
    pub(crate) wp: Arc<Waypoint>,
    /// The tunnel's target, and the service it turned out to be (with its port), if any.
    pub(crate) target: Destination,
    pub(crate) service: Option<(ServiceKey, u16)>,
    pub(crate) origin: ClusterId,
    /// The tunnel's metadata, carried on to every backend.
    pub(crate) baggage: crate::state::Onward,
    /// The original client, forwarded to every backend, if proven.
    pub(crate) peer: Option<SocketAddr>,
    /// `None` for plain TCP from outside the mesh.
    pub(crate) source: Option<Identity>,
    pub(crate) source_ip: IpAddr,
    pub(crate) rng: Mutex<SplitMix64>,
}

/// An upgrade request as it was allowed, kept to be judged again.
struct Upgraded {
    method: String,
    path: String,
    host: String,
    headers: Vec<(String, String)>,
}

// === impl Upgraded ===

impl Upgraded {
    /// Judges the request again, as it was allowed.
    fn recheck(&self, judge: &Judge) -> Result<(), Denial> {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        judge.recheck(Some(&HttpRequest {
            method: &self.method,
            path: &self.path,
            // Authorization does not read the query.
            query: "",
            host: &self.host,
            headers: &headers,
        }))
    }
}

/// A request's plan must land on a workload of the backend it was routed to, directly: never
/// through another waypoint (which would judge the waypoint, not the source, and leave the
/// routed service's scope and subset behind), and never on a same-named service elsewhere.
fn check_plan(plan: &Plan, want: Option<&ServiceKey>) -> Result<(), Refused> {
    if let Some(wp) = &plan.waypoint {
        return Err(Refused::Unroutable(format!(
            "the backend is served by another waypoint ({wp}); a route leads only to endpoints"
        )));
    }
    if let (Some(want), route::Class::Service { service, .. }) = (want, &plan.class)
        && service != want
    {
        return Err(Refused::Unroutable(format!(
            "the backend {want} resolved to {service}"
        )));
    }
    Ok(())
}

/// Requests with the same key can share an upstream connection.
pub(crate) fn key(plan: &Plan) -> String {
    let landing = plan.landing.as_ref().map(ToString::to_string);
    match &plan.transport {
        Transport::Hbone {
            connect_to,
            authority,
            ..
        } => format!(
            "{} via {connect_to} {authority}",
            landing.unwrap_or_default()
        ),
        other => format!("{} {other:?}", landing.unwrap_or_default()),
    }
}

impl Router for TunnelRouter {
    type Ticket = Plan;

    fn decide(&self, req: &HttpRequest<'_>, avoid: &[String]) -> Result<Choice<Plan>, Refused> {
        let snap = self.wp.store.load();
        let me = snap
            .workload(&self.wp.uid)
            .ok_or_else(|| Refused::Unroutable("this waypoint left the mesh".into()))?;
        let src = Source::on_behalf_of(me, &self.origin);
        let parent = self
            .service
            .as_ref()
            .and_then(|(k, port)| Some((snap.service(k)?, *port)));
        let chosen = parent.and_then(|(svc, port)| {
            let r = route::http::select(&svc.http_routes, req)?;
            Some((svc, port, r))
        });
        let mut rng = self.rng.lock();
        let mut redirect = None;
        let (dst, within, route_name, timeout, retries, want, headers) = match chosen {
            Some((_, port, r)) if r.redirect.is_some() => {
                // Answered here once authorized: judged, as a request without a route, by the
                // policy of an endpoint of the service it was sent to.
                redirect = r.redirect.as_deref().map(|rd| crate::redirect::Redirect {
                    status: rd.status,
                    location: rd.location(
                        &RedirectRequest {
                            scheme: RedirectScheme::Http,
                            host: req.host,
                            port,
                            path: req.path,
                            query: req.query,
                        },
                        route::http::holding(r, req),
                    ),
                });
                let name = Some(r.name.clone());
                let none = crate::edit::HeaderEdits::default();
                (
                    self.target.clone(),
                    Within::default(),
                    name,
                    None,
                    0,
                    None,
                    none,
                )
            }
            Some((svc, port, r)) => {
                let backend = route::http::pick_backend(r, &mut *rng).ok_or_else(|| {
                    Refused::Unroutable(format!("route {:?} has no backend with weight", r.name))
                })?;
                let dst = Destination::Host {
                    hostname: backend.service.hostname.clone(),
                    port: backend.port.unwrap_or(port),
                };
                let within = Within {
                    subset: Some(&backend.subset),
                    parent: Some(svc),
                };
                let timeout =
                    (r.timeout_ms > 0).then(|| Duration::from_millis(r.timeout_ms.into()));
                let want = Some(backend.service.clone());
                // Applied once the request is authorized below (it judges `req`, unedited).
                // Shared with the route: two reference counts, no copy of the edits.
                let headers = crate::edit::HeaderEdits {
                    request: r.request_headers.clone(),
                    response: r.response_headers.clone(),
                };
                let name = Some(r.name.clone());
                (dst, within, name, timeout, r.retries, want, headers)
            }
            None => {
                let none = crate::edit::HeaderEdits::default();
                (
                    self.target.clone(),
                    Within::default(),
                    None,
                    None,
                    0,
                    None,
                    none,
                )
            }
        };
        let mut picked = None;
        for _ in 0..REDRAWS {
            // The data path's decision: no trace is built.
            let plan = route::plan_within(&snap, src, &dst, &within, &mut *rng).map_err(|e| {
                self.wp.metrics.refused.inc();
                Refused::Unroutable(e.to_string())
            })?;
            check_plan(&plan, want.as_ref())?;
            let k = key(&plan);
            let fresh = !avoid.contains(&k);
            picked = Some((plan, k));
            if fresh {
                break;
            }
        }
        let Some((plan, key)) = picked else {
            return Err(Refused::Unroutable("no decision".into()));
        };
        drop(rng);
        let Some(landing) = &plan.landing else {
            return Err(Refused::Unroutable(format!(
                "{dst} is no longer a workload or service of the mesh"
            )));
        };
        let backend = landing.to_string();
        {
            let judge = Judge {
                store: self.wp.store.clone(),
                landing: landing.clone(),
                source: self.source.clone(),
                source_ip: self.source_ip,
                port: plan.landing_port,
                denials: self.wp.metrics.denials.clone(),
            };
            // In the snapshot the request was routed in: one load per request.
            judge
                .judge_in(&snap, Some(req))
                .map_err(|e| Refused::Denied(e.kind.to_string()))?;
        }
        Ok(Choice {
            key,
            backend,
            route: route_name,
            timeout,
            retries,
            protocol: ferry_core::protocol::http_upstream(&snap, &plan),
            headers,
            redirect,
            ticket: plan,
        })
    }

    fn upgraded(&self, plan: &Plan, req: &HttpRequest<'_>) -> Recheck {
        let Some(landing) = plan.landing.clone() else {
            return Box::pin(std::future::pending());
        };
        // Taken before the snapshot of the first re-check: no change is missed.
        let changes = ferry_runtime::recheck::from_now(&self.wp.changes);
        let judge = Judge {
            store: self.wp.store.clone(),
            landing,
            source: self.source.clone(),
            source_ip: self.source_ip,
            port: plan.landing_port,
            denials: self.wp.metrics.denials.clone(),
        };
        let upgraded = Upgraded {
            method: req.method.to_string(),
            path: req.path.to_string(),
            host: req.host.to_string(),
            headers: req
                .headers
                .iter()
                .map(|(n, v)| ((*n).to_string(), (*v).to_string()))
                .collect(),
        };
        Box::pin(ferry_runtime::recheck::until_denied(changes, move || {
            upgraded.recheck(&judge)
        }))
    }

    fn open(
        &self,
        plan: &Plan,
    ) -> impl std::future::Future<Output = Result<Link, ConnError>> + Send {
        let (wp, plan, peer, baggage) = (
            self.wp.clone(),
            plan.clone(),
            self.peer,
            self.baggage.clone(),
        );
        async move {
            wp.open_upstream(plan, peer, baggage)
                .await
                .map(crate::state::Opened::into_link)
        }
    }
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "redirect_tests.rs"]
mod redirect_tests;
