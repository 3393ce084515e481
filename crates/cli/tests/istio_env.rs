//! `ferry node` configured as Istio's node-proxy chart configures ztunnel: the control plane's
//! address, roots, node and cluster from the environment only, a Kubernetes service-account
//! token for its credential. It reaches `ferry control serve` (which checks the token against
//! the cluster's key set) and answers Istio's readiness probe on its own port.

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A key set with one EC key, and a token of `istio-system/ztunnel` bound to node `east-1`.
fn issuer(dir: &Path) -> (PathBuf, String) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = kp.public_key_raw();
    let jwks = json!({"keys": [{
        "kty": "EC", "crv": "P-256", "use": "sig", "kid": "k1",
        "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
        "y": URL_SAFE_NO_PAD.encode(&raw[33..]),
    }]});
    let path = dir.join("jwks.json");
    std::fs::write(&path, jwks.to_string()).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({
        "iss": ISSUER, "aud": ["istio-ca"], "exp": now + 3600, "iat": now,
        "sub": "system:serviceaccount:istio-system:ztunnel",
        "kubernetes.io": {
            "namespace": "istio-system",
            "pod": {"name": "ztunnel-abcde", "uid": "5b2d6c8e-1c1a-4b8e-9a57-0a1b2c3d4e5f"},
            "serviceaccount": {"name": "ztunnel", "uid": "9e8d7c6b-5a49-4837-a625-1a2b3c4d5e6f"},
            "node": {"name": "east-1", "uid": "1a2b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d"},
        },
    });
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some("k1".into());
    let token =
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_ec_der(&kp.serialize_der())).unwrap();
    (path, token)
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[test]
fn a_node_configured_by_istios_environment_reaches_the_control_plane_with_a_k8s_token() {
    let dir = TempDir(std::env::temp_dir().join(format!("ferry-istio-env-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (jwks, token) = issuer(&dir.0);
    let topology = dir.0.join("topology.yaml");
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/two-clusters.yaml"),
        &topology,
    )
    .unwrap();
    let state = dir.0.join("state");
    let mut control = ferry()
        .args(["control", "serve", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--topology")
        .arg(&topology)
        .arg("--state-dir")
        .arg(&state)
        .arg("--k8s-issuer")
        .arg(format!("east={ISSUER}"))
        .arg("--k8s-jwks")
        .arg(format!("east={}", jwks.display()))
        .args(["--server-name", "istiod.istio-system.svc"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(control.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _control = Killed(control);
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .expect("address printed")
        .to_string();
    let bundle = dir.0.join("root-cert.pem");
    let o = ferry()
        .args(["control", "bundle", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    std::fs::write(&bundle, o.stdout).unwrap();
    let token_file = dir.0.join("istio-token");
    std::fs::write(&token_file, &token).unwrap();
    let readiness = free_port();
    // Istio's variables for everything they cover; flags only for what has none (the token
    // path is fixed in Istio, the admin and readiness ports too, the state file is Ferry's
    // own).
    let node = ferry()
        .arg("node")
        .arg("--token-file")
        .arg(&token_file)
        .args(["--admin", "127.0.0.1:0", "--readiness"])
        .arg(readiness.to_string())
        .arg("--state-file")
        .arg(dir.0.join("node.pods"))
        // xDS is verified as istiod: the control plane's certificate carries that name too.
        .args(["--xds-server-name", "istiod.istio-system.svc"])
        .env("XDS_ADDRESS", &addr)
        .env("CA_ADDRESS", &addr)
        .env("XDS_ROOT_CA", &bundle)
        .env("CA_ROOT_CA", &bundle)
        .env("NODE_NAME", "east-1")
        .env("CLUSTER_ID", "east")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut node = Killed(node);
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        if let Some(a) = get(readiness, "/healthz/ready").filter(|a| a.starts_with("HTTP/1.1 200"))
        {
            break a;
        }
        assert!(
            node.0.try_wait().unwrap().is_none(),
            "ferry node exited before it was ready"
        );
        assert!(Instant::now() < deadline, "not ready in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(answer.contains("ready"), "{answer}");
    // The readiness port shows nothing else.
    let other = get(readiness, "/config_dump").unwrap();
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
}
