//! The ZDS client against an agent played by the test: a real SOCK_SEQPACKET socket, real
//! network namespaces passed as descriptors, a node whose pods are served (their capture takes
//! a connection from inside the pod to the node proxy's listener) or not (the same connection is
//! refused). Needs root (namespaces, iptables), skipped otherwise; namespaces are named after the
//! process and deleted however a test ends; addresses are in 198.18.0.0/15.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use ferry_api::zds::{
    AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadInfo, WorkloadRequest,
    WorkloadResponse, workload_request::Payload, workload_response,
};
use ferry_core::identity::Identity;
use ferry_core::model::{NodeName, WorkloadUid};
use ferry_core::store::Store;
use ferry_core::testing::MeshBuilder;
use ferry_hbone::pool::{Pool, PoolConfig};
use ferry_runtime::netns::Netns;
use ferry_tls::ca_client::{CertificateSource, FetchError};
use ferry_tls::certs::{CertManager, ManagerConfig};
use ferry_tls::config::Credentials;
use ferry_tls::testkit::TestCa;
use parking_lot::Mutex;
use prost::Message;
use tokio_seqpacket::ancillary::AncillaryMessageWriter;
use tokio_seqpacket::{UnixSeqpacket, UnixSeqpacketListener};

use crate::state::{Node, PodDialer};

/// How long any one step may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// Signs with a test CA.
struct Signer(TestCa);

impl CertificateSource for Signer {
    fn sign<'a>(
        &'a self,
        identity: &'a Identity,
        _lifetime: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Credentials, FetchError>> + Send + 'a>> {
        let creds = self.0.issue(identity);
        Box::pin(async move { Ok(creds) })
    }
}

/// A node proxy `east-1` whose mesh has pods `web-1`..`web-4` on it at 198.18.77.1..4.
struct Fixture {
    node: Arc<Node>,
    pods: Vec<PodNs>,
    _drain: ferry_runtime::drain::DrainTrigger,
    _changes: tokio::sync::watch::Sender<u64>,
}

/// A pod's network namespace, deleted on drop: loopback up, holding all of 198.18.0.0/15 (so a
/// connection that nothing captures is refused at once).
struct PodNs {
    name: String,
    uid: WorkloadUid,
    /// Its address: 198.18.77.`i`.
    i: usize,
    file: File,
}

/// The agent's side of one connection.
struct AgentConn(UnixSeqpacket);

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// === impl PodNs ===

impl PodNs {
    fn new(test: &str, i: usize, uid: WorkloadUid) -> Self {
        let name = format!("fz-{}-{test}-{i}", std::process::id());
        let file = Self::create(&name, i);
        Self { name, uid, i, file }
    }

    /// (Re)creates namespace `name` set up as a pod at 198.18.77.`i`, and opens it.
    fn create(name: &str, i: usize) -> File {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        ip(&["netns", "add", name]);
        ip(&["-n", name, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            name,
            "addr",
            "add",
            &format!("198.18.77.{i}/15"),
            "dev",
            "lo",
        ]);
        File::open(format!("/var/run/netns/{name}")).expect("the namespace")
    }

    /// Deletes the namespace and creates another under the same name (as a new sandbox).
    fn recreate(&mut self) {
        self.file = Self::create(&self.name, self.i);
    }

    /// Whether a connection from inside the pod to an address it does not serve is taken by a
    /// listener: the node proxy's outbound one, through the capture rules. Nothing in the pod
    /// listens on port 9, so without capture it is refused.
    async fn captured(&self) -> bool {
        let ns = Netns::open(Path::new(&format!("/var/run/netns/{}", self.name))).unwrap();
        let dst: SocketAddr = "198.18.200.1:9".parse().unwrap();
        let r = ns
            .run(move || std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(5)))
            .await
            .unwrap();
        // The node proxy may end the connection at once (nothing it could route to): a reset
        // that comes before connect returns still means a listener took it. With no listener
        // the SYN itself is refused.
        match r {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => false,
            Err(e) => panic!("connecting from pod {}: {e}", self.uid),
        }
    }
}

impl Drop for PodNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A node proxy `east-1` on `store`'s mesh keeping its pods in `state_file`, with its drain's
/// trigger and its snapshot-change sender (held for as long as it runs).
fn node(
    store: Arc<Store>,
    state_file: PathBuf,
) -> (
    Arc<Node>,
    ferry_runtime::drain::DrainTrigger,
    tokio::sync::watch::Sender<u64>,
) {
    let ca = TestCa::new("zds-test");
    let bundle = ca.bundle();
    let mut registry = prometheus_client::registry::Registry::default();
    let (trigger, drain) = ferry_runtime::drain::new();
    let (changes_tx, changes) = tokio::sync::watch::channel(0u64);
    let by_ip = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let node = Arc::new(Node {
        name: NodeName::new("east-1"),
        store,
        certs: CertManager::new(Arc::new(Signer(ca)), ManagerConfig::default()),
        bundle: Mutex::new(bundle),
        pool: Pool::new(PoolConfig {
            dialer: Arc::new(PodDialer(by_ip.clone())),
            ..PoolConfig::default()
        }),
        metrics: ferry_runtime::telemetry::Metrics::new(&mut registry),
        changes,
        drain,
        hbone_conns: Arc::default(),
        state_file: Some(state_file),
        agent_replayed: Some(std::sync::atomic::AtomicBool::new(false)),
        enrolling: Mutex::default(),
        unserved: Mutex::default(),
        uncaptured: Mutex::default(),
        capture_repairs: crate::admin::capture_repairs(&mut registry),
        connect_retries: crate::admin::connect_retries(&mut registry),
        health: crate::outlier::PassiveHealth::new(Default::default(), &mut registry),
        dns: crate::dns::Settings {
            upstream: None,
            metrics: crate::dns::Metrics::default(),
        },
        acceptor: Arc::new(ferry_runtime::accept::Acceptor::new(&mut registry)),
        idle_bound: Duration::from_secs(60),
        pods: Mutex::default(),
        by_ip,
        connections: AtomicU64::new(0),
        active: AtomicU64::new(0),
        peak_active: AtomicU64::new(0),
        halved: tokio::sync::Notify::new(),
    });
    (node, trigger, changes_tx)
}

// === impl Fixture ===

impl Fixture {
    fn new(test: &str) -> Self {
        let mut m = MeshBuilder::new();
        m.cluster("east", "net-east");
        m.node("east-1", "east", "us-east/a/r1");
        for i in 1..=4 {
            m.pod(&format!("web-{i}"), "east-1", &format!("198.18.77.{i}"));
        }
        let snap = m.build();
        let mut uids: Vec<WorkloadUid> = snap.workloads().map(|w| w.uid.clone()).collect();
        uids.sort();
        let pods = uids
            .into_iter()
            .enumerate()
            .map(|(i, uid)| PodNs::new(test, i + 1, uid))
            .collect();
        let state_file = socket_path(test).with_file_name("pods");
        let (node, drain, changes) = node(Arc::new(Store::new(snap)), state_file);
        Self {
            node,
            pods,
            _drain: drain,
            _changes: changes,
        }
    }

    /// Ends this node proxy as a crash does (its listeners close, its capture rules stay) and
    /// starts another on the same mesh and state file, as a restarted process would.
    async fn crash_and_restart(&mut self) {
        let pods: Vec<Arc<crate::state::Pod>> =
            self.node.pods.lock().drain().map(|(_, p)| p).collect();
        for p in &pods {
            let tasks: Vec<_> = p.tasks.lock().drain(..).collect();
            for t in tasks {
                t.abort();
                // Its listener is closed once the task is dropped.
                let _ = t.await;
            }
        }
        self.node.by_ip.lock().clear();
        let (node, drain, changes) = node(
            self.node.store.clone(),
            self.node.state_file.clone().expect("a state file"),
        );
        self.node = node;
        self._drain = drain;
        self._changes = changes;
    }

    fn served(&self) -> BTreeSet<WorkloadUid> {
        self.node.pods().iter().map(|p| p.uid.clone()).collect()
    }

    fn uids(&self, which: &[usize]) -> BTreeSet<WorkloadUid> {
        which.iter().map(|i| self.pods[*i].uid.clone()).collect()
    }

    /// Which of the pods their capture takes to the node proxy, by index.
    async fn captured(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, p) in self.pods.iter().enumerate() {
            if p.captured().await {
                out.push(i);
            }
        }
        out
    }
}

/// The agent's socket in a directory of its own.
fn socket_path(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-zds-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("agent.sock")
}

fn listen(path: &Path) -> UnixSeqpacketListener {
    let _ = std::fs::remove_file(path);
    UnixSeqpacketListener::bind(path).unwrap()
}

/// Accepts the node proxy's connection and reads its hello.
async fn accept(listener: &mut UnixSeqpacketListener) -> AgentConn {
    let conn = tokio::time::timeout(DEADLINE, listener.accept())
        .await
        .expect("the node proxy connects")
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(DEADLINE, conn.recv(&mut buf))
        .await
        .expect("the hello")
        .unwrap();
    assert_eq!(&buf[..n], [0x08, 0x01], "ZdsHello {{ version: V1 }}");
    AgentConn(conn)
}

fn request(p: Payload) -> Vec<u8> {
    WorkloadRequest { payload: Some(p) }.encode_to_vec()
}

// === impl AgentConn ===

impl AgentConn {
    /// Sends one packet (with `fd` in SCM_RIGHTS, if given) and returns the ack's error text.
    async fn send(&self, bytes: &[u8], fd: Option<&File>) -> String {
        let mut space = [0u8; 64];
        let mut ancillary = AncillaryMessageWriter::new(&mut space);
        if let Some(f) = fd {
            ancillary.add_fds(&[f.as_fd()]).unwrap();
        }
        self.0
            .send_vectored_with_ancillary(&[IoSlice::new(bytes)], &mut ancillary)
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let (n, _) = tokio::time::timeout(
            DEADLINE,
            self.0
                .recv_vectored_with_ancillary(&mut [IoSliceMut::new(&mut buf)], &mut []),
        )
        .await
        .expect("an ack")
        .unwrap();
        let response = WorkloadResponse::decode(&buf[..n]).expect("a WorkloadResponse");
        let Some(workload_response::Payload::Ack(ack)) = response.payload else {
            panic!("not an ack: {response:?}");
        };
        ack.error
    }

    async fn add(&self, pod: &PodNs) -> String {
        self.add_as(pod, pod.uid.as_str(), "not-looked-at").await
    }

    /// An add of `pod` that the agent calls `uid` and names `name` in namespace `default`.
    async fn add_as(&self, pod: &PodNs, uid: &str, name: &str) -> String {
        let add = request(Payload::Add(AddWorkload {
            uid: uid.into(),
            workload_info: Some(WorkloadInfo {
                name: name.into(),
                namespace: "default".into(),
                service_account: name.into(),
            }),
            ferry_uncaptured_ports: Vec::new(),
        }));
        self.send(&add, Some(&pod.file)).await
    }

    /// An add of `pod` with Ferry's extension: `ports` left out of its inbound capture.
    async fn add_uncaptured(&self, pod: &PodNs, ports: &[u32]) -> String {
        let add = request(Payload::Add(AddWorkload {
            uid: pod.uid.to_string(),
            workload_info: None,
            ferry_uncaptured_ports: ports.to_vec(),
        }));
        self.send(&add, Some(&pod.file)).await
    }

    async fn del(&self, pod: &PodNs) -> String {
        self.del_as(pod.uid.as_str()).await
    }

    async fn del_as(&self, uid: &str) -> String {
        let del = request(Payload::Del(DelWorkload { uid: uid.into() }));
        self.send(&del, None).await
    }

    async fn snapshot_sent(&self) -> String {
        self.send(&request(Payload::SnapshotSent(SnapshotSent {})), None)
            .await
    }
}

#[tokio::test]
async fn the_agents_pods_are_served_deleted_and_released_when_a_replay_omits_them() {
    if !is_root() {
        eprintln!("skipping: needs root for network namespaces and iptables");
        return;
    }
    let f = Fixture::new("replay");
    let path = socket_path("replay");
    let mut listener = listen(&path);
    let client = tokio::spawn(super::run(f.node.clone(), path.clone()));
    let agent = accept(&mut listener).await;
    let replayed = || {
        f.node
            .agent_replayed
            .as_ref()
            .is_some_and(|r| r.load(std::sync::atomic::Ordering::Acquire))
    };
    for i in 0..3 {
        assert_eq!(agent.add(&f.pods[i]).await, "", "add {}", f.pods[i].uid);
    }
    assert!(!replayed(), "not ready before the first replay ends");
    assert_eq!(agent.snapshot_sent().await, "");
    assert!(replayed(), "ready once it ended");
    assert_eq!(agent.del(&f.pods[1]).await, "");
    assert_eq!(f.served(), f.uids(&[0, 2]));
    assert_eq!(
        f.captured().await,
        [0, 2],
        "exactly the two pods are captured"
    );

    // Added twice: served once, the same pod.
    let before = f.node.pods.lock()[&f.pods[0].uid].clone();
    assert_eq!(agent.add(&f.pods[0]).await, "");
    assert!(Arc::ptr_eq(&before, &f.node.pods.lock()[&f.pods[0].uid]));
    assert_eq!(f.served(), f.uids(&[0, 2]));

    // The agent restarts; its replay names pod 0 only: pod 2 is released.
    drop(agent);
    drop(listener);
    let mut listener = listen(&path);
    let agent = accept(&mut listener).await;
    assert_eq!(
        f.served(),
        f.uids(&[0, 2]),
        "served while the agent was away"
    );
    assert_eq!(agent.add(&f.pods[0]).await, "");
    assert_eq!(agent.snapshot_sent().await, "");
    assert_eq!(f.served(), f.uids(&[0]));
    assert_eq!(f.captured().await, [0]);
    assert!(Arc::ptr_eq(&before, &f.node.pods.lock()[&f.pods[0].uid]));
    client.abort();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test]
async fn malformed_frames_a_missing_descriptor_and_unknown_requests_get_an_error_ack_and_change_nothing()
 {
    if !is_root() {
        eprintln!("skipping: needs root for network namespaces and iptables");
        return;
    }
    let f = Fixture::new("errors");
    let path = socket_path("errors");
    let mut listener = listen(&path);
    let client = tokio::spawn(super::run(f.node.clone(), path.clone()));
    let agent = accept(&mut listener).await;
    assert_eq!(agent.add(&f.pods[0]).await, "");
    assert_eq!(agent.snapshot_sent().await, "");
    let served = f.uids(&[0]);

    let garbage = agent.send(&[0xff, 0xff, 0xff], None).await;
    assert!(garbage.contains("not a WorkloadRequest"), "{garbage}");
    // An add without its descriptor.
    let add = request(Payload::Add(AddWorkload {
        uid: f.pods[1].uid.to_string(),
        workload_info: None,
        ferry_uncaptured_ports: Vec::new(),
    }));
    let missing = agent.send(&add, None).await;
    assert!(
        missing.contains("without the pod's network namespace"),
        "{missing}"
    );
    // A kind V1 does not have (field 4, NoSnapshotPresent in older versions; later kinds alike).
    let unknown = agent.send(&[0x22, 0x00], None).await;
    assert!(
        unknown.contains("no kind this node proxy knows"),
        "{unknown}"
    );
    // A del carrying a descriptor: refused, the pod stays.
    let del = request(Payload::Del(DelWorkload {
        uid: f.pods[0].uid.to_string(),
    }));
    let with_fd = agent.send(&del, Some(&f.pods[0].file)).await;
    assert!(with_fd.contains("only add does"), "{with_fd}");
    // Out of place: a keep, a second SnapshotSent.
    let keep = request(Payload::Keep(KeepWorkload {
        uid: f.pods[2].uid.to_string(),
    }));
    assert!(
        agent
            .send(&keep, None)
            .await
            .contains("keep after SnapshotSent")
    );
    assert!(agent.snapshot_sent().await.contains("second SnapshotSent"));
    // A packet larger than any request.
    let big = vec![0u8; super::frames::MAX_FRAME + 100];
    assert!(agent.send(&big, None).await.contains("larger than"));

    assert_eq!(f.served(), served);
    assert_eq!(f.captured().await, [0]);
    // The connection is still good.
    assert_eq!(agent.add(&f.pods[1]).await, "");
    assert_eq!(f.served(), f.uids(&[0, 1]));
    client.abort();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test]
async fn a_pod_the_agent_names_by_its_kubernetes_uid_is_found_by_name_and_namespace() {
    if !is_root() {
        eprintln!("skipping: needs root for network namespaces and iptables");
        return;
    }
    let f = Fixture::new("alias");
    let path = socket_path("alias");
    let mut listener = listen(&path);
    let client = tokio::spawn(super::run(f.node.clone(), path.clone()));
    let agent = accept(&mut listener).await;
    // As Istio's agent sends it: the Kubernetes UID, and the pod's name and namespace.
    let k8s_uid = "6f1c2a9e-0d4b-4b8e-9f27-3c1d5e7a0b42";
    assert_eq!(agent.add_as(&f.pods[3], k8s_uid, "web-4").await, "");
    assert_eq!(agent.snapshot_sent().await, "");
    assert_eq!(f.served(), f.uids(&[3]), "served as the mesh's web-4");
    assert_eq!(f.captured().await, [3]);
    // A replay after the agent restarts names it by the same uid: it stays.
    drop(agent);
    drop(listener);
    let mut listener = listen(&path);
    let agent = accept(&mut listener).await;
    assert_eq!(agent.add_as(&f.pods[3], k8s_uid, "web-4").await, "");
    assert_eq!(agent.snapshot_sent().await, "");
    assert_eq!(f.served(), f.uids(&[3]));
    assert_eq!(agent.del_as(k8s_uid).await, "");
    assert!(f.served().is_empty());
    assert!(f.captured().await.is_empty());
    client.abort();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// The rules of the pod's inbound capture chain, as `iptables -S FERRY_IN` prints them.
fn inbound_chain(pod: &PodNs) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &pod.name, "iptables", "-w", "-t", "nat"])
        .args(["-S", "FERRY_IN"])
        .output()
        .expect("running iptables");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn an_add_with_uncaptured_ports_leaves_exactly_those_out_of_the_pods_inbound_capture() {
    if !is_root() {
        eprintln!("skipping: needs root for network namespaces and iptables");
        return;
    }
    let f = Fixture::new("uncaptured");
    let path = socket_path("uncaptured");
    let mut listener = listen(&path);
    let client = tokio::spawn(super::run(f.node.clone(), path.clone()));
    let agent = accept(&mut listener).await;
    assert_eq!(agent.add_uncaptured(&f.pods[0], &[18080, 17778]).await, "");
    assert_eq!(agent.add(&f.pods[1]).await, "");
    assert_eq!(agent.snapshot_sent().await, "");
    let with = inbound_chain(&f.pods[0]);
    for port in [18080, 17778] {
        assert!(
            with.contains(&format!("--dport {port} -j RETURN")),
            "{port} is not left out:\n{with}"
        );
    }
    let without = inbound_chain(&f.pods[1]);
    assert!(without.contains("REDIRECT --to-ports 15006"), "{without}");
    assert!(!without.contains("--dport 18080"), "{without}");
    // The same add again (a replay): served once, as it is. Other ports: refused, unchanged.
    assert_eq!(agent.add_uncaptured(&f.pods[0], &[18080, 17778]).await, "");
    let other = agent.add_uncaptured(&f.pods[0], &[18081]).await;
    assert!(
        other.contains("enrolled with uncaptured=17778,18080; del it first"),
        "{other}"
    );
    assert_eq!(inbound_chain(&f.pods[0]), with);
    // A proxy port is never left out.
    let proxy = agent.add_uncaptured(&f.pods[2], &[15008]).await;
    assert!(proxy.contains("uncaptured port 15008"), "{proxy}");
    assert_eq!(f.served(), f.uids(&[0, 1]));
    // Released, then added with other ports: those.
    assert_eq!(agent.del(&f.pods[0]).await, "");
    assert_eq!(agent.add_uncaptured(&f.pods[0], &[18081]).await, "");
    let again = inbound_chain(&f.pods[0]);
    assert!(again.contains("--dport 18081 -j RETURN"), "{again}");
    assert!(!again.contains("--dport 18080"), "{again}");
    client.abort();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// The pod lines of `f`'s state file, each with the namespace's path and identity (nsfs device
/// and inode) as `stat` gives them for that pod's namespace.
fn state_lines(f: &Fixture) -> Vec<String> {
    let path = f.node.state_file.as_ref().unwrap();
    let mut lines: Vec<String> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

fn state_line(pod: &PodNs) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let m = pod.file.metadata().unwrap();
    format!(
        "{} /var/run/netns/{} ns={}:{}",
        pod.uid,
        pod.name,
        m.dev(),
        m.ino()
    )
}

/// Waits (up to [`DEADLINE`]) until `done` holds of the node.
async fn until(f: &Fixture, what: &str, done: impl Fn(&Node) -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done(&f.node) {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_node_proxy_restarted_while_its_agent_is_away_serves_the_state_files_pods_until_the_agent_replays()
 {
    if !is_root() {
        eprintln!("skipping: needs root for network namespaces and iptables");
        return;
    }
    let mut f = Fixture::new("restart");
    let path = socket_path("restart");
    let mut listener = listen(&path);
    let client = tokio::spawn(super::run(f.node.clone(), path.clone()));
    let agent = accept(&mut listener).await;
    for i in 0..3 {
        assert_eq!(agent.add(&f.pods[i]).await, "", "add {}", f.pods[i].uid);
    }
    assert_eq!(agent.snapshot_sent().await, "");
    assert_eq!(f.captured().await, [0, 1, 2]);
    // Each pod handed over as a descriptor is recorded by the path it is mounted at, with its
    // namespace's identity; the file is private.
    let mut expected: Vec<String> = f.pods[..3].iter().map(state_line).collect();
    expected.sort();
    assert_eq!(state_lines(&f), expected);
    let mode = std::fs::metadata(f.node.state_file.as_ref().unwrap())
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    // The agent goes away (its socket refuses), pod 2's namespace is created again under the
    // same name (another sandbox now), and the node proxy crashes: nothing takes the pods'
    // connections any more.
    drop(agent);
    drop(listener);
    f.pods[2].recreate();
    client.abort();
    f.crash_and_restart().await;
    assert!(
        f.captured().await.is_empty(),
        "the crashed proxy still serves"
    );

    // Restarted with no agent to replay: it serves pods 0 and 1 from the state file, and not
    // pod 2 in the namespace that only has its old name.
    let client = tokio::spawn(super::run(f.node.clone(), path.clone()));
    until(&f, "the state file's pods served again", |n| {
        n.pods.lock().len() == 2 && n.unserved.lock().len() == 1
    })
    .await;
    assert_eq!(f.served(), f.uids(&[0, 1]));
    assert_eq!(f.captured().await, [0, 1]);
    let why = f.node.unserved.lock()[&f.pods[2].uid].reason.clone();
    assert!(why.contains("is not the one recorded"), "{why}");
    assert!(
        !f.node
            .agent_replayed
            .as_ref()
            .unwrap()
            .load(std::sync::atomic::Ordering::Acquire),
        "not ready until the agent replays"
    );

    // The agent comes back; its replay names pod 0 only: that replay decides, pod 1 is released
    // (and pod 2 forgotten).
    let mut listener = listen(&path);
    let agent = accept(&mut listener).await;
    assert_eq!(agent.add(&f.pods[0]).await, "");
    assert_eq!(agent.snapshot_sent().await, "");
    assert_eq!(f.served(), f.uids(&[0]));
    assert!(f.node.unserved.lock().is_empty());
    assert_eq!(f.captured().await, [0]);
    assert_eq!(state_lines(&f), [state_line(&f.pods[0])]);
    client.abort();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
