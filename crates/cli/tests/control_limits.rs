//! `ferry control serve` as a user runs it, under hostile input: a topology file of deep
//! nesting, a parse that runs long, and unauthenticated clients sending large CA requests on
//! many streams. The CA and xDS keep answering, SIGTERM works, and memory stays bounded.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::citadel::IstioCertificateRequest;
use ferry_api::citadel::istio_certificate_service_client::IstioCertificateServiceClient;
use ferry_tls::ca_client::{CertificateSource, GrpcCa};
use parking_lot::Mutex;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

mod common;

use common::{Killed, TempDir, ferry, output};

/// The two-cluster example's text.
fn example() -> String {
    std::fs::read_to_string(common::example("two-clusters.yaml")).unwrap()
}

/// A running `ferry control serve`, killed when dropped; its log lines collected.
struct Control {
    child: Killed,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
    bundle: String,
    token: String,
}

fn serve(dir: &Path, extra: &[&str]) -> Control {
    let topology = dir.join("topology.yaml");
    std::fs::write(&topology, example()).unwrap();
    let state = dir.join("state");
    let mut child = ferry()
        .args([
            "control",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--topology")
        .arg(&topology)
        .arg("--state-dir")
        .arg(&state)
        .args(extra)
        .env("RUST_LOG", "info")
        .env("FERRY_LOG_FORMAT", "text")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ferry control starts");
    let log = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().unwrap();
    let lines = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            lines.lock().push(line);
        }
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .expect("address printed")
        .to_string();
    Control {
        child: Killed(child),
        addr,
        log,
        bundle: output(&["control", "bundle"], &state),
        token: output(&["control", "token", "--node", "east-1"], &state)
            .trim()
            .to_string(),
    }
}

impl Control {
    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Waits for a log line containing every one of `words`; returns it.
    fn logged(&self, words: &[&str], within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            if let Some(l) = self
                .log
                .lock()
                .iter()
                .find(|l| words.iter().all(|w| l.contains(w)))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < end,
                "no log line with {words:?}:\n{}",
                self.log.lock().join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A certificate for sleep-east (on east-1), with a deadline.
    async fn sign(&self) {
        let ca = GrpcCa::new(
            &format!("https://{}", self.addr),
            &self.bundle,
            "ferry-control",
            self.token.clone(),
            "east".into(),
        )
        .unwrap();
        tokio::time::timeout(
            Duration::from_secs(20),
            ca.sign(
                &"spiffe://cluster.local/ns/default/sa/sleep"
                    .parse()
                    .unwrap(),
                Duration::from_secs(3600),
            ),
        )
        .await
        .expect("the CA answers in time")
        .expect("signed");
    }

    /// A first full xDS sync of east-1, with a deadline.
    async fn sync(&self) {
        self.synced().await.abort();
    }

    /// A first full xDS sync of east-1, with a deadline; the client stays connected until the
    /// task is aborted.
    async fn synced(&self) -> tokio::task::JoinHandle<()> {
        let store = Arc::new(ferry_core::store::Store::default());
        let client = ferry_xds::client::XdsClient::new(
            ferry_xds::client::ClientConfig {
                endpoint: format!("https://{}", self.addr),
                bundle_pem: self.bundle.clone(),
                server_name: "ferry-control".into(),
                token: self.token.clone(),
                cluster: "east".into(),
                node_id: "ferry~east-1".into(),
                plaintext: false,
                backoff_initial: Duration::from_millis(50),
                backoff_max: Duration::from_millis(500),
            },
            store.clone(),
        );
        let mut ready = client.ready();
        let task = tokio::spawn(client.run());
        tokio::time::timeout(Duration::from_secs(20), ready.wait_for(|r| *r))
            .await
            .expect("xDS answers in time")
            .unwrap();
        assert!(store.load().workloads().count() > 0);
        task
    }

    /// The process's CPU time (user + system) so far.
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the command name (in parentheses): utime and stime are the 12th and
        // 13th, in clock ticks of 1/100 s (USER_HZ).
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        Duration::from_millis((f[11] + f[12]) * 10)
    }

    /// `VmRSS` and `VmHWM` (peak), in KiB.
    fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap()
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// SIGTERM, then the time until the process has exited (at most `within`).
    fn terminate(&mut self, within: Duration) -> Duration {
        let start = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        loop {
            if self.child.0.try_wait().unwrap().is_some() {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "still running {within:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Writes `text` aside and renames it over `path`, as an editor does.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("yaml.tmp");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_mib_of_nesting_is_rejected_with_its_place_while_the_ca_and_xds_answer() {
    let dir = TempDir::new("nesting");
    let cp = serve(&dir.0, &[]);
    cp.sign().await;
    let topology = dir.0.join("topology.yaml");
    let before = cp.cpu();
    replace(&topology, &format!("clusters: {}", "[".repeat(10 << 20)));
    let line = cp.logged(
        &["topology edit rejected", "1:74", "nesting at most 64 deep"],
        Duration::from_secs(30),
    );
    let cpu = cp.cpu().saturating_sub(before);
    eprintln!("CPU time to reject 10 MiB of nesting: {cpu:?} (debug build)\n{line}");
    assert!(line.contains("still serving the last good state"), "{line}");
    cp.sign().await;
    cp.sync().await;
    // The good file restored is seen.
    replace(&topology, &example());
    cp.logged(&["topology reloaded"], Duration::from_secs(30));
    cp.sign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parse_that_runs_long_blocks_neither_the_ca_xds_nor_sigterm() {
    let dir = TempDir::new("budget");
    // The depth limit lifted: the quadratic parse really runs (for minutes), on its thread.
    let mut cp = serve(
        &dir.0,
        &[
            "--topology-max-depth",
            "100000000",
            "--topology-parse-budget",
            "1",
        ],
    );
    replace(
        &dir.0.join("topology.yaml"),
        &format!("clusters: {}", "[".repeat(200_000)),
    );
    // While the parse runs, the CA and xDS answer.
    cp.sign().await;
    cp.sync().await;
    cp.logged(
        &["topology edit rejected", "expected a parse within 1s"],
        Duration::from_secs(30),
    );
    cp.sign().await;
    // SIGTERM ends it within the drain deadline, the parse thread still running and a node's
    // xDS stream still open.
    let node = cp.synced().await;
    let took = cp.terminate(ferry_control::app::DRAIN_DEADLINE + Duration::from_secs(5));
    eprintln!("exited {took:?} after SIGTERM");
    node.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_large_ca_requests_on_many_streams_leave_memory_bounded() {
    const CONNECTIONS: usize = 4;
    const STREAMS: usize = 50;
    const BODY: usize = 4 << 20;
    let dir = TempDir::new("rss");
    let cp = serve(&dir.0, &[]);
    cp.sign().await;
    let (rss_before, _) = cp.rss();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&cp.bundle))
        .domain_name("ferry-control");
    let body = Arc::new("A".repeat(BODY));
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let channel = Endpoint::from_shared(format!("https://{}", cp.addr))
            .unwrap()
            .tls_config(tls.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        for _ in 0..STREAMS {
            let mut client = IstioCertificateServiceClient::new(channel.clone())
                .max_encoding_message_size(usize::MAX);
            let body = body.clone();
            calls.spawn(async move {
                let req = IstioCertificateRequest {
                    csr: (*body).clone(),
                    validity_duration: 3600,
                    metadata: None,
                };
                client.create_certificate(req).await.map(|_| ())
            });
        }
    }
    let mut denied = 0;
    while let Some(r) = tokio::time::timeout(Duration::from_secs(120), calls.join_next())
        .await
        .expect("every call answered")
    {
        match r.unwrap() {
            Err(s) if s.code() == tonic::Code::PermissionDenied => denied += 1,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    let (rss_after, peak) = cp.rss();
    eprintln!(
        "{CONNECTIONS} connections x {STREAMS} streams x {} MiB unauthenticated: RSS {} MiB before, \
         {} MiB after, peak {} MiB",
        BODY >> 20,
        rss_before >> 10,
        rss_after >> 10,
        peak >> 10
    );
    assert_eq!(denied, CONNECTIONS * STREAMS);
    // Without the header check each stream buffered up to 4 MiB (200 streams: 800 MiB); now a
    // connection holds at most its 1 MiB receive window.
    assert!(
        peak < rss_before + 64 * 1024,
        "peak RSS {peak} KiB vs {rss_before} KiB before"
    );
    cp.sign().await;
}
