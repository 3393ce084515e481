//! Kubernetes service-account tokens at the CA and the xDS server, minted by a test issuer whose
//! discovery document and key set are served over real HTTP on loopback (cluster `east`), or
//! read from a JWKS file (cluster `west`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use ferry_api::ADDRESS_TYPE;
use ferry_api::citadel::IstioCertificateRequest;
use ferry_api::citadel::istio_certificate_service_client::IstioCertificateServiceClient;
use ferry_api::discovery::DeltaDiscoveryRequest;
use ferry_api::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ferry_control::ca::k8s::{ClusterIssuer, K8sConfig, K8sTokens, KeySource};
use ferry_control::ca::service::{CaService, Lifetimes};
use ferry_control::ca::signer::Ca;
use ferry_control::ca::token::NodeTokens;
use ferry_control::xds_server::XdsServer;
use ferry_core::identity::Identity;
use ferry_core::store::Store;
use ferry_core::testing::MeshBuilder;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::StreamExt as _;
use tonic::transport::{Channel, Endpoint, Server};

const A: &str = "spiffe://cluster.local/ns/default/sa/a";
const B: &str = "spiffe://cluster.local/ns/default/sa/b";
const D: &str = "spiffe://cluster.local/ns/default/sa/d";

// === the test issuer ===

/// A signing key and its JWK.
struct Key {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
}

impl Key {
    fn ec(kid: &str) -> Self {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        // An uncompressed point: 0x04, x, y.
        let raw = kp.public_key_raw();
        assert_eq!(raw.len(), 65);
        Self {
            kid: kid.into(),
            alg: Algorithm::ES256,
            encoding: EncodingKey::from_ec_der(&kp.serialize_der()),
            jwk: json!({
                "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
                "y": URL_SAFE_NO_PAD.encode(&raw[33..]),
            }),
        }
    }

    fn rsa(kid: &str) -> Self {
        let kp =
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                .unwrap();
        // PKCS#8 wraps the PKCS#1 key: SEQUENCE { version, algorithm, OCTET STRING pkcs1 }.
        let pkcs1 = yasna::parse_der(&kp.serialize_der(), |r| {
            r.read_sequence(|r| {
                r.next().read_u8()?;
                r.next().read_der()?;
                r.next().read_bytes()
            })
        })
        .unwrap();
        let (n, e) = yasna::parse_der(&pkcs1, |r| {
            r.read_sequence(|r| {
                r.next().read_u8()?;
                // A JWK's integers have no leading zero byte (RFC 7518, 6.3.1.1).
                let unsigned = |b: Vec<u8>| b.into_iter().skip_while(|x| *x == 0).collect();
                let n: Vec<u8> = unsigned(r.next().read_bigint_bytes()?.0);
                let e: Vec<u8> = unsigned(r.next().read_bigint_bytes()?.0);
                for _ in 0..6 {
                    r.next().read_der()?;
                }
                Ok((n, e))
            })
        })
        .unwrap();
        Self {
            kid: kid.into(),
            alg: Algorithm::RS256,
            encoding: EncodingKey::from_rsa_der(&pkcs1),
            jwk: json!({
                "kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
                "n": URL_SAFE_NO_PAD.encode(&n),
                "e": URL_SAFE_NO_PAD.encode(&e),
            }),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut h = Header::new(self.alg);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, claims, &self.encoding).unwrap()
    }
}

fn jwks(keys: &[&Key]) -> String {
    json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() }).to_string()
}

/// An OIDC issuer on loopback: `/.well-known/openid-configuration` and its `jwks_uri`.
struct Issuer {
    url: String,
    jwks: Arc<Mutex<String>>,
    /// Key-set documents served.
    fetches: Arc<AtomicUsize>,
}

impl Issuer {
    async fn start(tasks: &mut JoinSet<()>, jwks: String) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let doc = Arc::new(Mutex::new(jwks));
        let fetches = Arc::new(AtomicUsize::new(0));
        let discovery =
            json!({ "issuer": url, "jwks_uri": format!("{url}/openid/v1/jwks") }).to_string();
        let (d, f) = (doc.clone(), fetches.clone());
        tasks.spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let (d, f, discovery) = (d.clone(), f.clone(), discovery.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let body = match req.uri().path() {
                            "/.well-known/openid-configuration" => Some(discovery.clone()),
                            "/openid/v1/jwks" => {
                                f.fetch_add(1, Ordering::SeqCst);
                                Some(d.lock().clone())
                            }
                            _ => None,
                        };
                        async move {
                            let resp = match body {
                                Some(b) => hyper::Response::new(Full::new(Bytes::from(b))),
                                None => {
                                    let mut r = hyper::Response::new(Full::new(Bytes::new()));
                                    *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                                    r
                                }
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        Self {
            url,
            jwks: doc,
            fetches,
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The claims of a projected token of `istio-system/ztunnel`, pod `pod`, on `node` if given.
fn claims(iss: &str, pod: &str, node: Option<&str>) -> Value {
    let mut k8s = json!({
        "namespace": "istio-system",
        "pod": { "name": pod, "uid": "5b2d6c8e-1c1a-4b8e-9a57-0a1b2c3d4e5f" },
        "serviceaccount": { "name": "ztunnel", "uid": "9e8d7c6b-5a49-4837-a625-1a2b3c4d5e6f" },
    });
    if let Some(n) = node {
        k8s["node"] = json!({ "name": n, "uid": "1a2b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d" });
    }
    json!({
        "iss": iss,
        "aud": ["istio-ca"],
        "exp": now() + 600,
        "iat": now(),
        "nbf": now(),
        "sub": "system:serviceaccount:istio-system:ztunnel",
        "kubernetes.io": k8s,
    })
}

// === the control plane ===

/// Cluster `east`: `a` on n1, `b` and pod `istio-system/ztunnel-n2` on n2; cluster `west`: `d`
/// on w1.
fn store() -> Arc<Store> {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net")
        .cluster("west", "net")
        .node("n1", "east", "r/z/s")
        .node("n2", "east", "r/z/s")
        .node("w1", "west", "r/z/s");
    m.pod("a", "n1", "198.18.1.1");
    m.pod("b", "n2", "198.18.1.2");
    m.pod("d", "w1", "198.18.2.1");
    m.pod("ztunnel-n2", "n2", "198.18.1.3");
    let zt = m.workload_mut("ztunnel-n2");
    zt.namespace = "istio-system".into();
    zt.service_account = "ztunnel".into();
    Arc::new(Store::new(m.build()))
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Mesh {
    east: Issuer,
    east_key: Key,
    west_key: Key,
    west_iss: String,
    tokens: Arc<NodeTokens>,
    addr: SocketAddr,
    _dir: Dir,
    _tasks: JoinSet<()>,
}

impl Mesh {
    async fn start(tag: &str) -> Self {
        let mut tasks = JoinSet::new();
        let east_key = Key::ec("east-1");
        let east = Issuer::start(&mut tasks, jwks(&[&east_key])).await;
        let west_key = Key::rsa("west-1");
        let dir = Dir(std::env::temp_dir().join(format!("ferry-k8s-{}-{tag}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        let west_jwks = dir.0.join("west-jwks.json");
        std::fs::write(&west_jwks, jwks(&[&west_key])).unwrap();
        let west_iss = "https://kubernetes.default.svc.cluster.local".to_string();
        let config = K8sConfig {
            issuers: vec![
                ClusterIssuer {
                    cluster: "east".into(),
                    issuer: east.url.clone(),
                    keys: KeySource::Discovery,
                    ca: None,
                },
                ClusterIssuer {
                    cluster: "west".into(),
                    issuer: west_iss.clone(),
                    keys: KeySource::File(west_jwks),
                    ca: None,
                },
            ],
            // Every unknown `kid` refetches: the rotation case needs no waiting.
            refresh_interval: Duration::ZERO,
            ..K8sConfig::default()
        };
        let store = store();
        let k8s = Arc::new(K8sTokens::new(config, store.clone()).unwrap());
        let tokens = Arc::new(NodeTokens::from_secret(&[9; 32]));
        let ca = Arc::new(Ca::generate("cluster.local").unwrap());
        let ca_svc = CaService::new(ca, tokens.clone(), store.clone(), Lifetimes::default())
            .with_k8s(Some(k8s.clone()))
            .into_server();
        let resources = Arc::new(ferry_control::flatten::resource_set(&store.load()));
        let (res_tx, res_rx) = tokio::sync::watch::channel(resources);
        let xds = XdsServer::new(res_rx, Some(tokens.clone()))
            .with_k8s(Some(k8s))
            .into_server();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tasks.spawn(async move {
            let _keep = res_tx;
            let _ = Server::builder()
                .add_service(ca_svc)
                .add_service(xds)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l))
                .await;
        });
        Self {
            east,
            east_key,
            west_key,
            west_iss,
            tokens,
            addr,
            _dir: dir,
            _tasks: tasks,
        }
    }

    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// Asks for a certificate for `identity` with `token`, saying it is in `cluster`.
    async fn sign(
        &self,
        identity: &str,
        token: &str,
        cluster: Option<&str>,
    ) -> Result<Vec<String>, tonic::Status> {
        let id: Identity = identity.parse().unwrap();
        let csr = ferry_tls::ca_client::new_csr(&id).unwrap().0;
        self.sign_raw(csr, identity, token, cluster).await
    }

    async fn sign_raw(
        &self,
        csr: String,
        identity: &str,
        token: &str,
        cluster: Option<&str>,
    ) -> Result<Vec<String>, tonic::Status> {
        let mut fields = BTreeMap::new();
        fields.insert(
            "ImpersonatedIdentity".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
            },
        );
        let mut req = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: Some(prost_types::Struct { fields }),
        });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        if let Some(c) = cluster {
            req.metadata_mut().insert("clusterid", c.parse().unwrap());
        }
        IstioCertificateServiceClient::new(self.channel().await)
            .create_certificate(req)
            .await
            .map(|r| r.into_inner().cert_chain)
    }

    /// Opens an xDS stream with `token` and waits for the first push.
    async fn subscribe(&self, token: &str, cluster: Option<&str>) -> Result<usize, tonic::Status> {
        let first = DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.to_string(),
            ..Default::default()
        };
        let mut req =
            tonic::Request::new(tokio_stream::iter(vec![first]).chain(tokio_stream::pending()));
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        if let Some(c) = cluster {
            req.metadata_mut().insert("clusterid", c.parse().unwrap());
        }
        let mut stream = AggregatedDiscoveryServiceClient::new(self.channel().await)
            .delta_aggregated_resources(req)
            .await?
            .into_inner();
        let push = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("a push in time")?
            .expect("a push");
        Ok(push.resources.len())
    }
}

fn refused(r: Result<Vec<String>, tonic::Status>) -> (tonic::Code, String) {
    let e = r.expect_err("refused");
    (e.code(), e.message().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bound_to_a_pod_on_node_n_gets_only_the_identities_on_n() {
    let m = Mesh::start("colocated").await;
    let iss = m.east.url.clone();
    // Kubernetes 1.30+: the node claim names n1.
    let on_n1 = m.east_key.sign(&claims(&iss, "ztunnel-x", Some("n1")));
    let chain = m.sign(A, &on_n1, Some("east")).await.expect("a runs on n1");
    assert_eq!(chain.len(), 2);
    let (code, why) = refused(m.sign(B, &on_n1, Some("east")).await);
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(
        why.contains("no workload with identity") && why.contains("node n1"),
        "{why}"
    );
    // No node claim: the pod's node from the topology (ztunnel-n2 runs on n2).
    let on_n2 = m.east_key.sign(&claims(&iss, "ztunnel-n2", None));
    m.sign(B, &on_n2, None).await.expect("b runs on n2");
    let (_, why) = refused(m.sign(A, &on_n2, None).await);
    assert!(why.contains("node n2"), "{why}");
    // No node claim and a pod the topology does not know: refused, not guessed.
    let unknown = m.east_key.sign(&claims(&iss, "ztunnel-gone", None));
    let (_, why) = refused(m.sign(A, &unknown, None).await);
    assert!(
        why.contains("istio-system/ztunnel-gone is not in cluster east"),
        "{why}"
    );
    // Another cluster's keys come from its JWKS file, signed with RS256.
    let on_w1 = m
        .west_key
        .sign(&claims(&m.west_iss, "ztunnel-w", Some("w1")));
    m.sign(D, &on_w1, Some("west")).await.expect("d runs on w1");
    // Ferry's own node tokens keep working next to the JWTs.
    let node = m.tokens.issue(&"n1".into());
    m.sign(A, &node, None).await.expect("a Ferry node token");
    // The key set was fetched once for all of the east tokens above.
    assert_eq!(m.east.fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_token_is_refused_with_its_reason() {
    let m = Mesh::start("refused").await;
    let iss = m.east.url.clone();
    let mut expired = claims(&iss, "ztunnel-x", Some("n1"));
    expired["exp"] = json!(now() - 3600);
    expired["nbf"] = json!(now() - 7200);
    let mut audience = claims(&iss, "ztunnel-x", Some("n1"));
    audience["aud"] = json!(["kubernetes"]);
    let mut unbound = claims(&iss, "ztunnel-x", Some("n1"));
    unbound["kubernetes.io"]
        .as_object_mut()
        .unwrap()
        .remove("pod");
    let mut workload = claims(&iss, "a", Some("n1"));
    workload["kubernetes.io"]["namespace"] = json!("default");
    workload["kubernetes.io"]["serviceaccount"]["name"] = json!("a");
    let forger = Key::ec("east-1");
    let cases: Vec<(&str, String, Option<&str>, &str)> = vec![
        (
            "expired",
            m.east_key.sign(&expired),
            None,
            "the service-account token expired",
        ),
        (
            "wrong audience",
            m.east_key.sign(&audience),
            None,
            "is for audience [\"kubernetes\"], not one of [\"istio-ca\"]",
        ),
        (
            "unknown issuer",
            m.east_key.sign(&claims(
                "https://elsewhere.example",
                "ztunnel-x",
                Some("n1"),
            )),
            None,
            "issuer \"https://elsewhere.example\" is unknown",
        ),
        (
            "the caller says it is in another cluster",
            m.east_key.sign(&claims(&iss, "ztunnel-x", Some("n1"))),
            Some("west"),
            "issued by cluster east, but the caller says it is in cluster west",
        ),
        (
            "bound to a node of another cluster",
            m.east_key.sign(&claims(&iss, "ztunnel-x", Some("w1"))),
            None,
            "issued by cluster east, but its node w1 is in cluster west",
        ),
        (
            "another cluster's issuer with this cluster's key",
            m.east_key
                .sign(&claims(&m.west_iss, "ztunnel-x", Some("w1"))),
            None,
            "no key \"east-1\" among the signing keys of cluster west",
        ),
        (
            "bad signature",
            forger.sign(&claims(&iss, "ztunnel-x", Some("n1"))),
            None,
            "signature does not verify with the keys of cluster east",
        ),
        (
            "no pod binding",
            m.east_key.sign(&unbound),
            None,
            "not bound to a pod",
        ),
        (
            "not a node proxy's account",
            m.east_key.sign(&workload),
            None,
            "service account default/a is not a node proxy's",
        ),
        (
            "unknown token format",
            "not-a-token".to_string(),
            None,
            "unknown token format",
        ),
    ];
    for (case, token, cluster, reason) in cases {
        let (code, why) = refused(m.sign(A, &token, cluster).await);
        assert_eq!(code, tonic::Code::PermissionDenied, "{case}: {why}");
        assert!(why.contains(reason), "{case}: {why:?} lacks {reason:?}");
    }
    // Judged before the body: an expired token with a body over the CA's limit is refused for
    // the token, not for the size.
    let big = "x".repeat(ferry_control::ca::service::MAX_REQUEST_BYTES + 1);
    let (code, why) = refused(m.sign_raw(big, A, &m.east_key.sign(&expired), None).await);
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(why.contains("expired"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_fetched_on_its_first_token() {
    let m = Mesh::start("rotation").await;
    let iss = m.east.url.clone();
    m.sign(A, &m.east_key.sign(&claims(&iss, "zt", Some("n1"))), None)
        .await
        .expect("the first key");
    assert_eq!(m.east.fetches.load(Ordering::SeqCst), 1);
    // The cluster rotates: a new key (RSA this time) joins the set.
    let next = Key::rsa("east-2");
    *m.east.jwks.lock() = jwks(&[&m.east_key, &next]);
    m.sign(A, &next.sign(&claims(&iss, "zt", Some("n1"))), None)
        .await
        .expect("the rotated key, after one refetch");
    assert_eq!(m.east.fetches.load(Ordering::SeqCst), 2);
    // A known kid costs no fetch.
    m.sign(A, &next.sign(&claims(&iss, "zt", Some("n1"))), None)
        .await
        .unwrap();
    assert_eq!(m.east.fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_streams_open_for_a_valid_token_and_not_for_a_bad_one() {
    let m = Mesh::start("xds").await;
    let iss = m.east.url.clone();
    let good = m.east_key.sign(&claims(&iss, "ztunnel-x", Some("n1")));
    let n = m.subscribe(&good, Some("east")).await.expect("a stream");
    assert!(n > 0, "the first push carries the mesh's addresses");
    let mut expired = claims(&iss, "ztunnel-x", Some("n1"));
    expired["exp"] = json!(now() - 3600);
    let cases = [
        (m.east_key.sign(&expired), None, "expired"),
        (
            m.east_key
                .sign(&claims("https://elsewhere.example", "z", Some("n1"))),
            None,
            "is unknown",
        ),
        (
            good.clone(),
            Some("west"),
            "issued by cluster east, but the caller says",
        ),
    ];
    for (token, cluster, reason) in cases {
        let e = m.subscribe(&token, cluster).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(
            e.message().contains(reason),
            "{:?} lacks {reason:?}",
            e.message()
        );
    }
    let node = m.tokens.issue(&"n2".into());
    m.subscribe(&node, None).await.expect("a Ferry node token");
}
