//! `ferry explain --conn ID`: what the data path recorded for one connection (its record at the
//! hop whose `conn.id` it is, and the other hops of the same trace), next to the explanation of
//! the same flow on the current state.
//!
//! The flow is derived from the record: the source by its address (its cluster or name breaks a
//! tie), the destination as the source asked for it. A record keeps where a connection was
//! dialled and what its tunnel asked for, not always the address the app dialled: a service
//! reached directly on a pod shows the pod, so the service's hostname and port stand in for it.

use std::net::{IpAddr, SocketAddr};

use anyhow::bail;
use ferry_core::snapshot::Snapshot;
use serde_json::{Value, json};

use crate::observe::field;

/// A record and its flow, as found.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) record: Value,
    /// The other hops of its trace, in path order.
    pub(crate) hops: Vec<Value>,
}

/// The record with id `id` among `records` (every component's), with the other hops of its
/// trace. `asked` names where the records came from, for the error.
pub(crate) fn find(records: &[Value], id: &str, asked: &str) -> anyhow::Result<Found> {
    let Some(record) = records.iter().find(|r| field(r, "id") == id) else {
        let mut newest: Vec<&str> = records.iter().rev().map(|r| field(r, "id")).collect();
        newest.truncate(5);
        bail!(
            "no connection record with id {id:?} at {asked} ({} records kept{}); ids are \
             `<process>-<n>`, as the access log's conn.id and `ferry observe` print them",
            records.len(),
            if newest.is_empty() {
                String::new()
            } else {
                format!(", the newest: {}", newest.join(", "))
            }
        );
    };
    let trace = field(record, "trace_id");
    let mut hops: Vec<Value> = if trace.is_empty() {
        Vec::new()
    } else {
        records
            .iter()
            .filter(|r| field(r, "trace_id") == trace && field(r, "id") != id)
            .cloned()
            .collect()
    };
    hops.sort_by_key(crate::trace::order);
    Ok(Found {
        record: record.clone(),
        hops,
    })
}

// === impl Found ===

impl Found {
    /// The record where the connection started: the source's outbound hop of the same trace if
    /// there is one, else the record itself.
    fn origin(&self) -> &Value {
        if field(&self.record, "direction") == "outbound" {
            return &self.record;
        }
        self.hops
            .iter()
            .find(|r| field(r, "direction") == "outbound")
            .unwrap_or(&self.record)
    }

    /// `(from, to)` for `ferry explain`, derived from the records on `snap`; why not, if not.
    pub(crate) fn flow(&self, snap: &Snapshot) -> Result<(String, String), String> {
        let r = self.origin();
        Ok((source(snap, r)?, destination(snap, r)?))
    }

    /// The record, its trace's other hops and the explanation (or why there is none), as JSON.
    pub(crate) fn json(&self, explained: &Value) -> Value {
        json!({
            "record": self.record,
            "hops": self.hops,
            "explained": explained,
        })
    }

    /// What the data path recorded, as text.
    pub(crate) fn text(&self) -> String {
        let r = &self.record;
        let mut out = format!(
            "connection {} as {} recorded it ({}, ended {})\n",
            field(r, "id"),
            field(r, "component"),
            field(r, "direction"),
            r["at_ms"]
                .as_u64()
                .map_or_else(|| "at an unknown time".into(), utc)
        );
        let line = |out: &mut String, k: &str, v: String| {
            if !v.is_empty() {
                out.push_str(&format!("  {k:<8} {v}\n"));
            }
        };
        line(&mut out, "from", endpoint(r, "src"));
        line(&mut out, "to", destination_text(r));
        line(&mut out, "path", field(r, "path").to_string());
        line(
            &mut out,
            "route",
            match field(r, "route") {
                "" => "(no decision recorded at this hop)".into(),
                route => route.to_string(),
            },
        );
        line(&mut out, "verdict", verdict(r));
        line(&mut out, "timings", timings(r));
        let mut outcome = format!(
            "flags={} sent={} recv={} duration {} ms",
            field(r, "response_flags"),
            r["bytes_sent"],
            r["bytes_recv"],
            r["duration_ms"]
        );
        if !field(r, "error").is_empty() {
            outcome.push_str(&format!(", error: {}", field(r, "error")));
        }
        line(&mut out, "outcome", outcome);
        if !field(r, "trace_id").is_empty() {
            line(&mut out, "trace", field(r, "trace_id").to_string());
        }
        if !self.hops.is_empty() {
            out.push_str("  the other hops of its trace:\n");
            for h in &self.hops {
                out.push_str(&format!("    {}\n", crate::observe::text(h)));
                if !field(h, "route").is_empty() {
                    out.push_str(&format!("      route: {}\n", field(h, "route")));
                }
            }
        }
        out
    }
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS.mmm UTC` (the civil calendar from days,
/// after Howard Hinnant's `civil_from_days`).
fn utc(ms: u64) -> String {
    let (days, rest) = (ms / 86_400_000, ms % 86_400_000);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03} UTC",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000
    )
}

/// `workload (address) identity [cluster c]` of side `side` (`src` or `dst`).
fn endpoint(r: &Value, side: &str) -> String {
    let get = |k: &str| field(r, &format!("{side}_{k}")).to_string();
    let mut parts = Vec::new();
    match (get("workload"), get("addr")) {
        (w, a) if w.is_empty() => parts.push(a),
        (w, a) if a.is_empty() => parts.push(w),
        (w, a) => parts.push(format!("{w} ({a})")),
    }
    if !get("identity").is_empty() {
        parts.push(get("identity"));
    }
    if !get("cluster").is_empty() {
        parts.push(format!("[cluster {}]", get("cluster")));
    }
    parts.join(" ")
}

fn destination_text(r: &Value) -> String {
    let mut text = format!("dialled {}", field(r, "dst_addr"));
    if !field(r, "dst_hbone_addr").is_empty() {
        text.push_str(&format!(", tunnel target {}", field(r, "dst_hbone_addr")));
    }
    if !field(r, "dst_service").is_empty() {
        text.push_str(&format!(", service {}", field(r, "dst_service")));
    }
    if !field(r, "dst_workload").is_empty() {
        text.push_str(&format!(", workload {}", field(r, "dst_workload")));
    }
    if !field(r, "dst_identity").is_empty() {
        text.push_str(&format!(" {}", field(r, "dst_identity")));
    }
    if !field(r, "dst_cluster").is_empty() {
        text.push_str(&format!(" [cluster {}]", field(r, "dst_cluster")));
    }
    text
}

fn verdict(r: &Value) -> String {
    match field(r, "verdict") {
        "denied" => format!(
            "DENIED by policy {} rule {}",
            field(r, "policy"),
            field(r, "rule")
        ),
        v => v.to_string(),
    }
}

/// The phases the record timed, in microseconds from the connection's start.
fn timings(r: &Value) -> String {
    [
        ("decision", "decision_us"),
        ("connect", "connect_us"),
        ("tls", "tls_us"),
        ("first byte", "first_byte_us"),
    ]
    .iter()
    .filter_map(|(name, k)| match r[*k].as_u64() {
        Some(us) if us > 0 => Some(format!("{name} {us} us")),
        _ => None,
    })
    .collect::<Vec<_>>()
    .join(", ")
}

/// The source as `cluster/namespace/name`: the workload with the record's source address
/// (its cluster, then its name, break a tie).
fn source(snap: &Snapshot, r: &Value) -> Result<String, String> {
    let addr = field(r, "src_addr");
    let ip = addr
        .parse::<SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| addr.parse::<IpAddr>())
        .map_err(|_| format!("the record has no source address ({addr:?})"))?;
    let mut matches: Vec<_> = snap
        .workloads()
        .filter(|w| w.addresses.contains(&ip))
        .collect();
    for (key, value) in [
        ("cluster", field(r, "src_cluster")),
        ("name", field(r, "src_workload")),
    ] {
        if matches.len() > 1 && !value.is_empty() {
            matches.retain(|w| match key {
                "cluster" => w.cluster.as_str() == value,
                _ => w.name == value || w.uid.as_str() == value,
            });
        }
    }
    match matches.as_slice() {
        [w] => Ok(format!("{}/{}/{}", w.cluster, w.namespace, w.name)),
        [] => Err(format!(
            "no workload has the source address {ip} in the current state"
        )),
        _ => Err(format!(
            "the source address {ip} is several workloads' in the current state"
        )),
    }
}

/// The destination as the source asked for it: a service address the tunnel asked for as is;
/// a service reached on one of its pods by its hostname and port; else the address.
fn destination(snap: &Snapshot, r: &Value) -> Result<String, String> {
    let target = match field(r, "dst_hbone_addr") {
        "" => field(r, "dst_addr"),
        t => t,
    };
    let addr: SocketAddr = target
        .parse()
        .map_err(|_| format!("the record has no destination address ({target:?})"))?;
    let is_vip = snap
        .services()
        .any(|s| s.vips.iter().any(|v| v.ip == addr.ip()));
    let service = field(r, "dst_service");
    if is_vip || service.is_empty() {
        return Ok(addr.to_string());
    }
    let hostname = service.split_once('/').map_or(service, |(_, h)| h);
    let port = snap
        .services_by_hostname(hostname)
        .iter()
        .filter_map(|k| snap.service(k))
        .flat_map(|s| s.ports.iter())
        .find(|p| p.target_port == addr.port() || p.port == addr.port())
        .map_or(addr.port(), |p| p.port);
    Ok(format!("{hostname}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Snapshot {
        let text = include_str!("../../../../examples/two-clusters.yaml");
        ferry_topology::parse("two-clusters.yaml", text)
            .unwrap()
            .snapshot
    }

    fn record(id: &str, direction: &str, fields: &[(&str, &str)]) -> Value {
        let mut r = json!({"id": id, "trace_id": "t1", "direction": direction});
        for (k, v) in fields {
            r[*k] = Value::from(*v);
        }
        r
    }

    #[test]
    fn the_flow_is_derived_from_the_source_hop_of_the_trace() {
        let snap = example();
        let outbound = record(
            "a-1",
            "outbound",
            &[
                ("src_addr", "198.18.1.10:40000"),
                ("dst_addr", "198.18.1.50:15008"),
                // Through a waypoint: the tunnel asks for the service address itself.
                ("dst_hbone_addr", "198.18.10.1:80"),
                ("dst_service", "default/echo.default.svc.cluster.local"),
            ],
        );
        let inbound = record(
            "b-1",
            "inbound",
            &[
                ("src_addr", "198.18.1.50:41000"),
                ("dst_hbone_addr", "198.18.1.20:8080"),
            ],
        );
        let records = [outbound, inbound];
        let found = find(&records, "b-1", "here").unwrap();
        assert_eq!(found.hops.len(), 1, "the other hop of the trace");
        assert_eq!(
            found.flow(&snap).unwrap(),
            (
                "east/default/sleep-east".to_string(),
                "198.18.10.1:80".to_string()
            )
        );
    }

    #[test]
    fn a_refused_connection_keeps_the_address_the_app_dialled() {
        let snap = example();
        let refused = record(
            "a-2",
            "outbound",
            &[
                ("src_addr", "198.18.1.10:40001"),
                ("dst_addr", "198.19.10.2:80"),
            ],
        );
        let found = find(std::slice::from_ref(&refused), "a-2", "here").unwrap();
        assert_eq!(found.flow(&snap).unwrap().1, "198.19.10.2:80");
        let unknown = record("a-3", "outbound", &[("src_addr", "10.9.9.9:1")]);
        let found = find(std::slice::from_ref(&unknown), "a-3", "here").unwrap();
        assert!(found.flow(&snap).unwrap_err().contains("10.9.9.9"));
        let e = find(&[refused], "zz-9", "the lab").unwrap_err().to_string();
        assert!(
            e.contains("\"zz-9\" at the lab") && e.contains("a-2"),
            "{e}"
        );
    }

    #[test]
    fn epoch_milliseconds_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(utc(1_796_164_665_898), "2026-12-01 22:37:45.898 UTC");
    }
}
