//! Connection records from admin endpoints given by address (`/records`, JSON lines), asked all
//! at once ([`crate::observe::Source`]: one HTTP/1.1 GET each, bounded in time): what `ferry
//! explain --conn --admin` and the control plane's mesh map read.

use std::net::SocketAddr;

use serde_json::Value;

/// Every record of every admin endpoint in `admins` (`(component name, address)`), each with
/// its `component`, oldest first; and, for each endpoint that did not answer, why.
pub(crate) async fn records(admins: &[(String, SocketAddr)]) -> (Vec<Value>, Vec<String>) {
    let mut asks = tokio::task::JoinSet::new();
    for (i, (name, addr)) in admins.iter().cloned().enumerate() {
        let mut source = crate::observe::Source::admin(&addr.to_string());
        source.name = name;
        asks.spawn(async move {
            let body = source.get("/records").await;
            (i, source.name, body)
        });
    }
    let mut answers = asks.join_all().await;
    answers.sort_by_key(|(i, _, _)| *i);
    let mut records = Vec::new();
    let mut problems = Vec::new();
    for (_, name, body) in answers {
        match body {
            Ok(body) => parse_lines(&name, &body, &mut records, &mut problems),
            Err(e) => problems.push(format!("{e:#}")),
        }
    }
    records.sort_by_key(|r| r["at_ms"].as_u64().unwrap_or(0));
    (records, problems)
}

/// The JSON lines of `body` as records of `component`.
fn parse_lines(component: &str, body: &str, out: &mut Vec<Value>, problems: &mut Vec<String>) {
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line) {
            Ok(mut v) => {
                v["component"] = Value::String(component.to_string());
                out.push(v);
            }
            Err(e) => problems.push(format!("{component}: a record that is not JSON: {e}")),
        }
    }
}
