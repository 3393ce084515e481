//! `ferry explain`: resolve the user's source and destination, run the routing decision and the
//! destination's authorization on the topology, and print the path.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use ferry_core::authz::{self, ConnInfo};
use ferry_core::identity::Identity;
use ferry_core::model::{TunnelProtocol, Workload};
use ferry_core::random::SplitMix64;
use ferry_core::route::{self, Decision, Destination, Source, Transport};
use ferry_core::snapshot::Snapshot;

use crate::{ExplainArgs, Output};

mod conn;
pub(crate) mod fetch;
mod live;
mod report;
pub(crate) mod text;

pub(crate) use live::ControlSource;
pub(crate) use report::{Authorization, Hop, Report, SourceView};

/// The built-in example: a newcomer can run `ferry explain` with nothing else.
const EXAMPLE_NAME: &str = "examples/two-clusters.yaml (built in)";
const EXAMPLE: &str = include_str!("../../../../examples/two-clusters.yaml");

/// The tour `ferry explain` gives on the built-in example without --from/--to: one path for each
/// of Ferry's rules.
const TOUR: &[(&str, &str, &str)] = &[
    (
        "a global service with pods in both clusters, through a shared waypoint",
        "east/default/sleep-east",
        "echo.default.svc.cluster.local:80",
    ),
    (
        "a local service behind the same (global) waypoint: east stays in east",
        "east/default/sleep-east",
        "198.18.10.2:80",
    ),
    (
        "the same local service from west stays in west",
        "west/default/sleep-west",
        "198.19.10.2:80",
    ),
    (
        "a multi-cluster service whose endpoint is east's own service address: one decision, one hop",
        "east/default/sleep-east",
        "198.18.10.4:80",
    ),
    (
        "a workload with its own waypoint, chosen on the source's network",
        "east/default/sleep-east",
        "198.18.2.60:5432",
    ),
    (
        "a global service with pods only in west: through west's east-west gateway",
        "east/default/sleep-east",
        "search.default.svc.cluster.local:80",
    ),
    (
        "an address outside the mesh: passed through",
        "east/default/sleep-east",
        "198.19.250.10:443",
    ),
];

/// Exit status when the connection would be refused (no route, or denied by policy).
const EXIT_REFUSED: u8 = 3;
/// Exit status for bad input: unreadable topology, unknown source or destination.
const EXIT_USAGE: u8 = 2;

pub(crate) fn run(args: &ExplainArgs) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferry explain: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run_inner(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    if let Some(id) = &args.conn {
        return run_conn(args, id);
    }
    let requests: Vec<(Option<String>, &str, &str)> = match (&args.from, &args.to) {
        (Some(f), Some(t)) => vec![(None, f.as_str(), t.as_str())],
        _ if args.lab => bail!("--from and --to are required with --lab"),
        _ if args.control.control.is_some() => {
            bail!("--from and --to are required with --control")
        }
        _ if args.topology.is_none() => TOUR
            .iter()
            .map(|(title, f, t)| (Some((*title).to_string()), *f, *t))
            .collect(),
        _ => bail!("--from and --to are required with --topology"),
    };
    // The mesh, and how the text output names it.
    let (snap, name) = match state(args)? {
        Some(state) => state,
        None => (
            Arc::new(ferry_topology::parse(EXAMPLE_NAME, EXAMPLE)?.snapshot),
            EXAMPLE_NAME.to_string(),
        ),
    };
    let single = requests.len() == 1;
    let mut reports = Vec::new();
    for (title, from, to) in requests {
        let mut report = explain(&snap, from, to, args.seed)?;
        report.title = title;
        reports.push(report);
    }
    match args.output {
        Output::Json if single => println!("{}", serde_json::to_string_pretty(&reports[0])?),
        Output::Json => println!("{}", serde_json::to_string_pretty(&reports)?),
        Output::Text => {
            for (i, r) in reports.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print!("{}", text::text(r, &name));
            }
        }
    }
    Ok(if single && reports[0].refused() {
        ExitCode::from(EXIT_REFUSED)
    } else {
        ExitCode::SUCCESS
    })
}

/// The mesh the arguments name (--topology, --lab or --control) and how the text names it;
/// `None` when they name none.
fn state(args: &ExplainArgs) -> anyhow::Result<Option<(Arc<Snapshot>, String)>> {
    if let Some(path) = &args.topology {
        let snap = ferry_topology::load_file(path)?.snapshot;
        return Ok(Some((Arc::new(snap), path.display().to_string())));
    }
    if args.lab {
        let path = ferry_lab::live_topology(lab_dir(args))?;
        let snap = ferry_topology::load_file(&path)?.snapshot;
        let name = format!("the running lab's topology ({})", path.display());
        return Ok(Some((Arc::new(snap), name)));
    }
    if let Some(endpoint) = args.control.endpoint() {
        let snap = args.control.snapshot()?;
        let name = format!("the mesh the control plane at {endpoint} serves (over xDS)");
        return Ok(Some((snap, name)));
    }
    Ok(None)
}

fn lab_dir(args: &ExplainArgs) -> &Path {
    args.state_dir
        .as_deref()
        .unwrap_or(Path::new(ferry_lab::DEFAULT_STATE_DIR))
}

/// `--conn ID`: the record, its trace's other hops, and the explanation of its flow on the
/// current state when one is given.
fn run_conn(args: &ExplainArgs, id: &str) -> anyhow::Result<ExitCode> {
    let (records, asked) = if args.lab {
        let dir = lab_dir(args);
        let records = crate::observe::gather(dir)?;
        (records, format!("the lab in {}", dir.display()))
    } else if !args.admin.is_empty() {
        let admins: Vec<(String, SocketAddr)> = args
            .admin
            .iter()
            .map(|a| (format!("admin/{a}"), *a))
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (records, problems) = runtime.block_on(fetch::records(&admins));
        if problems.len() == admins.len() {
            bail!("no admin endpoint answered: {}", problems.join("; "));
        }
        for p in &problems {
            eprintln!("ferry explain: {p}");
        }
        let list: Vec<String> = args.admin.iter().map(ToString::to_string).collect();
        (records, format!("the admin endpoints {}", list.join(", ")))
    } else {
        bail!("--conn needs where to read records: --lab, or --admin IP:PORT (repeatable)");
    };
    let found = conn::find(&records, id, &asked)?;
    // The flow on the current state: given, or derived from the records.
    let explained = match state(args)? {
        None => {
            Err("no current state to explain on: add --control URL or --topology FILE".to_string())
        }
        Some((snap, name)) => {
            let flow = match (&args.from, &args.to) {
                (Some(f), Some(t)) => Ok((f.clone(), t.clone())),
                _ => found.flow(&snap),
            };
            flow.and_then(|(from, to)| {
                explain(&snap, &from, &to, args.seed)
                    .map(|r| (from, to, r, name))
                    .map_err(|e| format!("{e:#}"))
            })
        }
    };
    match args.output {
        Output::Json => {
            let explained = match &explained {
                Ok((from, to, report, _)) => {
                    let mut v = serde_json::to_value(report)?;
                    v["refused"] = serde_json::Value::Bool(report.refused());
                    serde_json::json!({"from": from, "to": to, "report": v})
                }
                Err(why) => serde_json::json!({ "error": why }),
            };
            println!("{}", serde_json::to_string_pretty(&found.json(&explained))?);
        }
        Output::Text => {
            print!("{}", found.text());
            println!();
            match &explained {
                Ok((from, to, report, name)) => {
                    println!("The same flow now (--from {from} --to {to}):");
                    print!("{}", text::text(report, name));
                }
                Err(why) => println!("No explanation of the same flow now: {why}."),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Explains one connection.
pub(crate) fn explain(snap: &Snapshot, from: &str, to: &str, seed: u64) -> anyhow::Result<Report> {
    let src = resolve_source(snap, from)?;
    let dst = parse_destination(snap, to)?;
    let identity = src.identity().context("source identity")?;
    let mut rng = SplitMix64::new(seed);
    let decision = route::route(snap, Source::new(&src), &dst, &mut rng);
    let node = src
        .node
        .as_ref()
        .map_or("(none)".to_string(), ToString::to_string);
    let mut hops = Vec::new();
    // A waypoint decides again, on behalf of the original source's cluster.
    let waypoint = match &decision.outcome {
        Ok(plan) if plan.waypoint.is_some() => plan
            .landing
            .as_ref()
            .and_then(|u| snap.workload(u))
            .cloned(),
        _ => None,
    };
    match waypoint {
        Some(wp) => {
            hops.push(Hop {
                by: format!("the node proxy on node {node}"),
                decision,
                authorization: Authorization::NotEnforced {
                    why: "the waypoint is the destination of this hop; it applies the service's policy itself".into(),
                },
                http_routes: Vec::new(),
            });
            let wp_identity = wp.identity().context("waypoint identity")?;
            let next_dst = match (&dst, hops[0].decision.outcome.as_ref().map(|p| &p.class)) {
                (_, Ok(route::Class::Workload { workload, port })) => {
                    let w = snap
                        .workload(workload)
                        .context("workload behind the waypoint")?;
                    let ip = w.addresses.first().copied().context("workload address")?;
                    Destination::Addr(SocketAddr::new(ip, *port))
                }
                (d, _) => d.clone(),
            };
            let decision = route::route(
                snap,
                Source::on_behalf_of(&wp, &src.cluster),
                &next_dst,
                &mut rng,
            );
            let authorization = authorize(snap, &wp, &wp_identity, &decision);
            let http_routes = match decision.outcome.as_ref().map(|p| &p.class) {
                Ok(route::Class::Service { service, .. }) => snap
                    .service(service)
                    .map(|svc| svc.http_routes.iter().map(describe_route).collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            hops.push(Hop {
                by: format!(
                    "waypoint instance {} (for a source in cluster {})",
                    wp.uid, src.cluster
                ),
                decision,
                authorization,
                http_routes,
            });
        }
        None => {
            let authorization = authorize(snap, &src, &identity, &decision);
            hops.push(Hop {
                by: format!("the node proxy on node {node}"),
                decision,
                authorization,
                http_routes: Vec::new(),
            });
        }
    }
    Ok(Report {
        title: None,
        source: SourceView {
            workload: src,
            identity: identity.to_string(),
        },
        destination: dst.to_string(),
        seed,
        hops,
    })
}

fn authorize(
    snap: &Snapshot,
    peer: &Workload,
    identity: &Identity,
    decision: &Decision,
) -> Authorization {
    let Ok(plan) = &decision.outcome else {
        return Authorization::NotEnforced {
            why: "the connection is refused before it leaves".into(),
        };
    };
    let landing = plan.landing.as_ref().and_then(|uid| snap.workload(uid));
    let (Some(dst), Transport::Hbone { .. } | Transport::GatewayHbone { .. }) =
        (landing, &plan.transport)
    else {
        return Authorization::NotEnforced {
            why: "the destination is outside the mesh: no node proxy enforces policy for it".into(),
        };
    };
    if dst.tunnel == TunnelProtocol::Tcp {
        return Authorization::NotEnforced {
            why: "the destination is not enrolled in the mesh".into(),
        };
    }
    let conn = ConnInfo {
        source_identity: Some(identity),
        source_ip: peer
            .addresses
            .first()
            .copied()
            .unwrap_or(IpAddr::from([0, 0, 0, 0])),
        destination_ip: dst
            .addresses
            .first()
            .copied()
            .unwrap_or(IpAddr::from([0, 0, 0, 0])),
        destination_port: plan.landing_port,
        via_waypoint: authz::is_waypoint_of(snap, dst, Some(identity)),
    };
    Authorization::Checked {
        at: dst.uid.to_string(),
        peer: identity.to_string(),
        port: plan.landing_port,
        verdict: authz::authorize(snap, dst, &conn),
    }
}

/// Finds the source workload from what the user typed.
pub(crate) fn resolve_source(snap: &Snapshot, from: &str) -> anyhow::Result<Arc<Workload>> {
    let by_ip = |network: Option<&str>, ip: IpAddr| -> Vec<Arc<Workload>> {
        snap.workloads()
            .filter(|w| {
                w.addresses.contains(&ip) && network.is_none_or(|n| w.network.as_str() == n)
            })
            .cloned()
            .collect()
    };
    let matches: Vec<Arc<Workload>> = if let Ok(ip) = from.parse::<IpAddr>() {
        by_ip(None, ip)
    } else {
        let parts: Vec<&str> = from.split('/').collect();
        match parts.as_slice() {
            [net, ip] if ip.parse::<IpAddr>().is_ok() => by_ip(Some(net), ip.parse()?),
            [name] => snap
                .workloads()
                .filter(|w| w.name == *name)
                .cloned()
                .collect(),
            [ns, name] => snap
                .workloads()
                .filter(|w| w.namespace == *ns && w.name == *name)
                .cloned()
                .collect(),
            [cluster, ns, name] => snap
                .workloads()
                .filter(|w| w.cluster.as_str() == *cluster && w.namespace == *ns && w.name == *name)
                .cloned()
                .collect(),
            _ => bail!(
                "source {from:?}: expected a workload `name`, `namespace/name`, `cluster/namespace/name`, an IP, or `network/IP`"
            ),
        }
    };
    match matches.as_slice() {
        [one] => Ok(one.clone()),
        [] => {
            let mut known: Vec<String> = snap
                .workloads()
                .map(|w| format!("{}/{}/{}", w.cluster, w.namespace, w.name))
                .collect();
            known.sort();
            known.truncate(12);
            bail!(
                "source {from:?}: no such workload (known workloads include: {})",
                known.join(", ")
            )
        }
        many => {
            let mut names: Vec<String> = many
                .iter()
                .map(|w| format!("{}/{}/{} on {}", w.cluster, w.namespace, w.name, w.network))
                .collect();
            names.sort();
            bail!(
                "source {from:?} is ambiguous: {}; qualify it",
                names.join(", ")
            )
        }
    }
}

/// Parses `IP:port` or `hostname:port`; a hostname must name a service.
pub(crate) fn parse_destination(snap: &Snapshot, to: &str) -> anyhow::Result<Destination> {
    if let Ok(addr) = to.parse::<SocketAddr>() {
        return Ok(Destination::Addr(addr));
    }
    let Some((host, port)) = to.rsplit_once(':') else {
        bail!("destination {to:?}: expected IP:port or hostname:port");
    };
    let port: u16 = port.parse().with_context(|| {
        format!("destination {to:?}: port {port:?} is not a number from 0 to 65535")
    })?;
    if host.parse::<IpAddr>().is_ok() {
        bail!("destination {to:?}: an IPv6 address needs brackets, e.g. [fd00::1]:{port}");
    }
    if snap.services_by_hostname(host).is_empty() {
        let mut known: Vec<&str> = snap.services().map(|s| s.hostname.as_str()).collect();
        known.sort_unstable();
        known.truncate(12);
        bail!(
            "destination {to:?}: no service has hostname {host:?} (known: {})",
            known.join(", ")
        );
    }
    Ok(Destination::Host {
        hostname: host.to_string(),
        port,
    })
}

/// One HTTP route in a line: `split: every request -> 75% default/shop... {version=v1}, ...`,
/// then its deadline, retries and header edits.
fn describe_route(r: &ferry_core::model::HttpRoute) -> String {
    use ferry_core::model::{PathMatch, StringMatch};
    let matches = if r.matches.is_empty() {
        "every request".to_string()
    } else {
        r.matches
            .iter()
            .map(|m| {
                let mut parts = Vec::new();
                match &m.path {
                    Some(PathMatch::Exact(p)) => parts.push(format!("path {p}")),
                    Some(PathMatch::Prefix(p)) => parts.push(format!("path {p}/*")),
                    None => {}
                }
                if let Some(method) = &m.method {
                    parts.push(format!("method {method}"));
                }
                for (name, v) in &m.headers {
                    parts.push(match v {
                        StringMatch::Exact(x) => format!("{name}: {x}"),
                        StringMatch::Prefix(x) => format!("{name}: {x}*"),
                        StringMatch::Suffix(x) => format!("{name}: *{x}"),
                        StringMatch::Presence => format!("{name} present"),
                    });
                }
                for (name, value) in &m.query {
                    parts.push(format!("query {name}={value:?}"));
                }
                parts.join(" and ")
            })
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let total: u64 = r
        .backends
        .iter()
        .map(|b| u64::from(b.weight))
        .sum::<u64>()
        .max(1);
    let backends = r
        .backends
        .iter()
        .map(|b| {
            let subset = if b.subset.is_empty() {
                String::new()
            } else {
                let labels: Vec<String> =
                    b.subset.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!(" {{{}}}", labels.join(","))
            };
            let port = b.port.map(|p| format!(":{p}")).unwrap_or_default();
            format!(
                "{}% {}{port}{subset}",
                u64::from(b.weight) * 100 / total,
                b.service.hostname
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let to = match r.redirect.as_deref() {
        Some(rd) => describe_redirect(rd),
        None => backends,
    };
    let mut text = format!("{}: {matches} -> {to}", r.name);
    if r.timeout_ms > 0 {
        text.push_str(&format!(", timeout {} ms", r.timeout_ms));
    }
    if r.retries > 0 {
        text.push_str(&format!(", {} retries", r.retries));
    }
    for (which, m) in [
        ("request", &r.request_headers),
        ("response", &r.response_headers),
    ] {
        if !m.is_empty() {
            text.push_str(&format!(", {which} headers: {}", describe_edits(m)));
        }
    }
    text
}

/// A redirect, what it changes of the request: `redirect 301 (scheme https, hostname
/// new.example, port 8443, matched prefix -> /new; the rest as requested, query kept)`.
fn describe_redirect(r: &ferry_core::model::RequestRedirect) -> String {
    use ferry_core::model::RedirectPath;
    let mut parts = Vec::new();
    if let Some(s) = r.scheme {
        parts.push(format!("scheme {}", s.as_str()));
    }
    if let Some(h) = &r.hostname {
        parts.push(format!("hostname {h}"));
    }
    if let Some(p) = r.port {
        parts.push(format!("port {p}"));
    }
    match &r.path {
        Some(RedirectPath::Full(p)) => parts.push(format!("path {p}")),
        Some(RedirectPath::PrefixMatch(p)) => parts.push(format!("matched prefix -> {p}")),
        None => {}
    }
    parts.push("the rest as requested, query kept".into());
    format!(
        "redirect {} ({}; answered by the waypoint once authorized)",
        r.status,
        parts.join(", ")
    )
}

/// Header edits in the order they are applied: `remove x-debug, set x-env: prod, add x-hop: wp`.
fn describe_edits(m: &ferry_core::model::HeaderModifier) -> String {
    let removed = m.remove.iter().map(|n| format!("remove {n}"));
    let set = m.set.iter().map(|(n, v)| format!("set {n}: {v}"));
    let added = m.add.iter().map(|(n, v)| format!("add {n}: {v}"));
    removed
        .chain(set)
        .chain(added)
        .collect::<Vec<_>>()
        .join(", ")
}
