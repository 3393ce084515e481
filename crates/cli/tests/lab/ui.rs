//! The mesh map (`ferry ui --lab`) in headless Chromium, driven over WebDriver: the clusters, a
//! service with its scope, a live flow through a waypoint, its hop records, and an explained
//! path; a screenshot of the map is saved as `target/artifacts/mesh-map.png`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without
//! chromedriver the test fails under CI (`CI=true`) and skips elsewhere.

use std::io::BufRead;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use crate::harness::{Lab, ferry};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// How long the page may take to show what the test looks for.
const PAGE_BOUND: Duration = Duration::from_secs(20);

/// A process killed with its whole process group when dropped, however the test ends
/// (chromedriver's group holds the browsers it started).
#[derive(Debug)]
struct Killed {
    child: Child,
    what: &'static str,
}

impl Drop for Killed {
    fn drop(&mut self) {
        // Every process was started as the leader of its own group.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("stopped {}", self.what);
    }
}

/// A directory removed when dropped.
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the browser is here; `false` (skip) outside CI, a failure under CI.
fn browser_present() -> bool {
    let present = Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists();
    if !present {
        let why = format!(
            "{CHROMEDRIVER} or {CHROMIUM} is missing: `apt-get install -y chromium chromium-driver` (as .ci/run does)"
        );
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the mesh map test needs a browser under CI: {why}"
        );
        eprintln!("skipping the mesh map test: {why}");
    }
    present
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `ferry ui --lab` on a free loopback port, and the map's address.
fn start_ui(lab: &Lab) -> (Killed, String) {
    let mut child = ferry()
        .args(["ui", "--lab", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&lab.dir)
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let guard = Killed {
        child,
        what: "ferry ui",
    };
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("serving the mesh map on ")
        .unwrap_or_else(|| panic!("ferry ui printed {line:?}"))
        .to_string();
    (guard, url)
}

/// chromedriver on a free loopback port, answering; its WebDriver address.
fn start_chromedriver() -> (Killed, String) {
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let guard = Killed {
        child,
        what: "chromedriver and its browser",
    };
    let deadline = Instant::now() + PAGE_BOUND;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    (guard, format!("http://127.0.0.1:{port}"))
}

/// One connection from `pod` to `to` with `ferry trace`: its trace id and its hops' directions.
fn traced(lab: &Lab, pod: &str, to: &str) -> (String, Vec<String>) {
    let out = ferry()
        .args(["trace", pod, to, "-o", "json", "--state-dir"])
        .arg(&lab.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ferry trace {pod} {to}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hops = v["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["direction"].as_str().unwrap_or("").to_string())
        .collect();
    (v["trace_id"].as_str().unwrap().to_string(), hops)
}

/// The text of the first element `css` finds, once it is there.
async fn text_of(c: &Client, css: &str) -> String {
    c.wait()
        .at_most(PAGE_BOUND)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the map: {e}"))
        .text()
        .await
        .unwrap()
}

#[test]
fn the_mesh_map_shows_a_live_flow_through_the_waypoint_and_its_hops() {
    if !browser_present() {
        return;
    }
    let Some(lab) = Lab::up_with(None, "fM") else {
        return;
    };
    let (_ui, url) = start_ui(&lab);
    // echo-beta to audit's VIP: through audit-waypoint-beta, then to an audit pod.
    let (trace, hops) = traced(&lab, "echo-beta", "198.18.10.5:80");
    assert_eq!(hops, ["outbound", "waypoint", "inbound"], "trace {trace}");
    // And one that policy deny-admin-port refuses at echo-alpha-2's node proxy.
    assert!(lab.send("sleep", "198.18.2.20:9090", "denied\n").is_err());
    let (_driver, webdriver) = start_chromedriver();
    let profile = TempDir(
        std::env::temp_dir().join(format!("ferry-ui-test-chromium-{}", std::process::id())),
    );
    let artifacts = PathBuf::from(env!("CARGO_BIN_EXE_ferry"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("mesh-map.png");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1500,1000",
                    format!("--user-data-dir={}", profile.0.display()),
                ],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let c = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&webdriver)
            .await
            .expect("a WebDriver session in headless Chromium");
        let checked = check_the_map(&c, &url, &trace, &screenshot).await;
        let _ = c.close().await;
        checked
    });
    eprintln!("screenshot: {}", screenshot.display());
}

async fn check_the_map(c: &Client, url: &str, trace: &str, screenshot: &Path) {
    c.goto(url).await.unwrap();
    // The clusters, each with its network, and a service with its scope and waypoint.
    for cluster in ["alpha", "beta"] {
        let text = text_of(c, &format!(r#"g[data-cluster="{cluster}"]"#)).await;
        assert!(
            text.contains(cluster) && text.contains("network flat"),
            "{text}"
        );
    }
    let audit = text_of(c, r#"g[data-service="audit"]"#).await;
    assert!(
        audit.contains("scope local") && audit.contains("waypoint audit-waypoint"),
        "{audit}"
    );
    let waypoint = text_of(c, r#"g[data-waypoint="audit-waypoint"]"#).await;
    assert!(waypoint.contains("audit-waypoint-beta"), "{waypoint}");
    // The live flow of the traced connection, allowed, with its three hops.
    let flow = format!(r#"g[data-flow="{trace}"][data-hops="3"]"#);
    let drawn = c
        .wait()
        .at_most(PAGE_BOUND)
        .for_element(Locator::Css(&flow))
        .await
        .unwrap_or_else(|e| panic!("no flow {trace} with 3 hops on the map: {e}"));
    assert_eq!(
        drawn.attr("data-verdict").await.unwrap().as_deref(),
        Some("allowed")
    );
    c.wait()
        .at_most(PAGE_BOUND)
        .for_element(Locator::Css(r#"g.flow[data-verdict="denied"]"#))
        .await
        .expect("the denied connection drawn as a denied flow");
    c.find(Locator::Css(&format!(
        r#"circle[data-flow-handle="{trace}"]"#
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    // Its hop records, in hop order.
    c.wait()
        .at_most(PAGE_BOUND)
        .for_element(Locator::Css(&format!(r#"#hops[data-trace="{trace}"]"#)))
        .await
        .expect("the clicked flow's hops");
    let mut order = Vec::new();
    for row in c.find_all(Locator::Css("#hops tbody tr")).await.unwrap() {
        order.push(row.attr("data-hop").await.unwrap().unwrap_or_default());
    }
    assert_eq!(order, ["outbound", "waypoint", "inbound"]);
    let hops = text_of(c, "#hops tbody").await;
    assert!(
        hops.contains("waypoint/audit-waypoint-beta") && hops.contains("echo-beta"),
        "{hops}"
    );
    // What would happen from echo-beta to audit: explained, and drawn.
    for (field, value) in [
        ("explain-from", "echo-beta"),
        ("explain-to", "198.18.10.5:80"),
    ] {
        let input = c.find(Locator::Id(field)).await.unwrap();
        input.send_keys(value).await.unwrap();
    }
    c.find(Locator::Id("explain-go"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let explained = text_of(c, r#"#explain-result[data-state="allowed"]"#).await;
    assert!(explained.contains("audit-waypoint-beta"), "{explained}");
    c.find(Locator::Css(
        r#"#explained path[data-explained="198.18.10.5:80"]"#,
    ))
    .await
    .expect("the explained path drawn");
    let png = c.screenshot().await.unwrap();
    std::fs::write(screenshot, png).unwrap();
}
