//! The node agent (`ferry cni agent`): one per node, beside the node proxy. It listens for the
//! plugin's questions on one Unix socket and for the node proxy on another (ZDS, the socket
//! the node proxy's `--zds-socket` names), holds every enrolled pod's network namespace open,
//! and keeps the list in a state file so that, restarted, it serves the pods that started before
//! it again.
//!
//! Enrollment is Istio's: on Kubernetes ([`Kubernetes`]) the agent watches every Namespace and
//! its node's Pods, and a pod is enrolled when it or its namespace is labelled
//! `istio.io/dataplane-mode=ambient` (`none` on the pod opts it out; host-network pods never,
//! ended pods are released: [`enroll`]). A label changed while the pod runs enrolls or releases
//! it then ([`reconcile`]), and each pod's `ambient.istio.io/redirection` annotation says whether
//! the agent handed it to the node proxy, as Istio's agent writes it. The flags (`--namespace`,
//! or all but the excluded ones with `--all-namespaces`) enroll namespaces as their label would;
//! without Kubernetes they alone decide.
//!
//! A pod is enrolled only once the node proxy took it: an add is answered when the node proxy
//! acked it (its capture is in place), and fails when no node proxy is connected or it refused,
//! so the pod does not start uncaptured (fail closed). When a node proxy (re)connects, the agent
//! replays every pod it holds and then `snapshot_sent`; the node proxy releases the pods of
//! its earlier session that the replay left out. The newest node proxy gets the changes; an
//! older one still connected (a surge upgrade: the new one started beside it) keeps its
//! connection, idle, until it drains and closes it, and serves its pods meanwhile.

mod discover;
mod enroll;
mod kube;
mod pods;
mod reconcile;
mod zds;

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context;
use ferry_api::zds::WorkloadInfo;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio_seqpacket::UnixSeqpacketListener;

use crate::spec::PodRef;
use crate::wire::{Answer, Ask, MAX_LINE};
use enroll::{Override, Verdict, Why};
pub use kube::{KubeStatus, Kubernetes};
use pods::{Kept, Pod, Pods, uid};
use zds::{Link, Op, OpSender};

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the plugin asks.
    pub plugin_socket: PathBuf,
    /// Where the node proxy connects (ZDS).
    pub zds_socket: PathBuf,
    /// Namespaces whose pods are enrolled.
    pub namespaces: BTreeSet<String>,
    /// Enroll the pods of every namespace but `excluded`.
    pub all_namespaces: bool,
    pub excluded: BTreeSet<String>,
    /// Where the enrolled pods are kept across restarts.
    pub state_file: PathBuf,
    /// Read enrollment from the cluster's labels (else the flags alone decide).
    pub kubernetes: Option<Kubernetes>,
    /// The node's processes (the host's `/proc`; in a pod, where it is mounted), among whose
    /// network namespaces the agent finds the pods that started before it.
    pub proc_dir: PathBuf,
}

/// What the plugin's questions and the node proxy's connection share.
#[derive(Debug)]
struct Agent {
    config: Config,
    state: Mutex<State>,
    next_link: AtomicU64,
    /// The cluster, with Kubernetes.
    kube: Option<Arc<kube::Watch>>,
    /// Pods asked into the mesh whose network namespaces were not found (warned of once while
    /// they stay so), and when to look for them again.
    missing: Mutex<reconcile::Missing>,
}

#[derive(Debug, Default)]
struct State {
    pods: Pods,
    node: Option<NodeLink>,
}

/// The connected node proxy.
#[derive(Debug)]
struct NodeLink {
    id: u64,
    ops: OpSender,
    /// It acknowledged the replay.
    replayed: Arc<AtomicBool>,
}

/// Runs the agent until the task is dropped.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let (pods, gone) = Pods::load(&config.state_file)?;
    for g in &gone {
        tracing::info!(netns = %g, "a kept pod's namespace is gone; not served again");
    }
    tracing::info!(pods = pods.len(), "node agent starting");
    let plugin = bind_stream(&config.plugin_socket)?;
    let zds = bind_seqpacket(&config.zds_socket)?;
    let (kube, mut tasks) = match config.kubernetes.clone() {
        Some(k) => {
            let (w, tasks) = kube::Watch::start(k);
            (Some(w), tasks)
        }
        None => (None, Vec::new()),
    };
    let agent = Arc::new(Agent {
        config,
        state: Mutex::new(State { pods, node: None }),
        next_link: AtomicU64::new(1),
        kube,
        missing: Mutex::default(),
    });
    agent.save();
    tracing::info!(plugin = %agent.config.plugin_socket.display(), zds = %agent.config.zds_socket.display(), node = agent.kube.as_ref().map(|w| w.node.as_str()), "node agent serving");
    let node_side = tokio::spawn(accept_node_proxies(agent.clone(), zds));
    if let Some(w) = agent.kube.clone() {
        tasks.push(tokio::spawn(reconcile::follow(agent.clone(), w)));
    }
    // The watch and the reconciliation end with this task.
    let _tasks: Vec<AbortOnDrop> = tasks.into_iter().map(AbortOnDrop).collect();
    loop {
        let (conn, _) = match plugin.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "plugin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        let agent = agent.clone();
        tokio::spawn(async move { agent.answer_plugin(conn).await });
        if node_side.is_finished() {
            anyhow::bail!("the ZDS listener stopped");
        }
    }
}

fn remove_stale(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow::anyhow!(
            "removing the stale {}: {e}",
            path.display()
        )),
    }
}

fn owner_only(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))
}

fn bind_stream(path: &Path) -> anyhow::Result<UnixListener> {
    remove_stale(path)?;
    let l = UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))?;
    owner_only(path)?;
    Ok(l)
}

fn bind_seqpacket(path: &Path) -> anyhow::Result<UnixSeqpacketListener> {
    remove_stale(path)?;
    let l = UnixSeqpacketListener::bind(path)
        .with_context(|| format!("listening on {}", path.display()))?;
    owner_only(path)?;
    Ok(l)
}

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Takes node proxy connections; each new one replaces the last.
async fn accept_node_proxies(agent: Arc<Agent>, listener: UnixSeqpacketListener) {
    let mut listener = listener;
    loop {
        match listener.accept().await {
            Ok(conn) => {
                let agent = agent.clone();
                tokio::spawn(async move { agent.serve_node(Link(conn)).await });
            }
            Err(e) => {
                tracing::warn!(error = %e, "ZDS accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

// === impl Agent ===

impl Agent {
    /// The namespaces the flags enroll.
    fn flags(&self) -> Override<'_> {
        Override {
            namespaces: &self.config.namespaces,
            all_namespaces: self.config.all_namespaces,
            excluded: &self.config.excluded,
        }
    }

    /// Writes the pod list; a failure is logged (the pods are served all the same).
    fn save(&self) {
        let state = self.state.lock();
        if let Err(e) = state.pods.save(&self.config.state_file) {
            tracing::warn!(file = %self.config.state_file.display(), error = %e, "the pod list could not be written");
        }
    }

    /// One node proxy, from its hello to its going away.
    async fn serve_node(self: Arc<Self>, link: Link) {
        let id = self.next_link.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = link.hello().await {
            tracing::warn!(error = %e, "a node proxy connection ended before its hello");
            return;
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<Op>();
        let replayed = Arc::new(AtomicBool::new(false));
        // The replay and the changes after it: whatever is not in the one is in the other.
        let replay: Vec<(String, Kept, Arc<File>)> = {
            let mut state = self.state.lock();
            state.node = Some(NodeLink {
                id,
                ops: tx,
                replayed: replayed.clone(),
            });
            state
                .pods
                .enrolled()
                .map(|(u, kept, netns)| (u.clone(), kept.clone(), netns.clone()))
                .collect()
        };
        tracing::info!(
            link = id,
            pods = replay.len(),
            "node proxy connected; replaying"
        );
        let ended = async {
            for (u, kept, netns) in &replay {
                if let Err(e) = link
                    .add(u, info(&kept.pod), &kept.uncaptured, netns)
                    .await?
                {
                    tracing::warn!(pod = %u, error = %e, "the node proxy refused a replayed pod");
                }
            }
            if let Err(e) = link.snapshot_sent().await? {
                tracing::warn!(error = %e, "the node proxy refused the end of the replay");
            }
            replayed.store(true, Ordering::Release);
            tracing::info!(link = id, "replay acknowledged");
            // Pods whose labels asked for the mesh while no node proxy was there.
            if let Some(w) = &self.kube {
                w.kick();
            }
            loop {
                tokio::select! {
                    op = rx.recv() => match op {
                        Some(op) => link.carry(op).await?,
                        // Replaced by a newer node proxy (a surge upgrade: the new one took the
                        // replay and serves the pods beside this one). The connection stays open,
                        // idle, until this node proxy closes it as it drains: closed by the
                        // agent, it would connect again and take the pods back.
                        None => {
                            tracing::info!(link = id, "a newer node proxy took over; this one's connection is kept, idle, until it closes it");
                            link.closed().await;
                            return Ok(());
                        }
                    },
                    () = link.closed() => return Err(zds::LinkError::Closed),
                }
            }
        };
        let r: Result<(), zds::LinkError> = ended.await;
        if let Err(e) = r {
            tracing::info!(link = id, error = %e, "node proxy connection ended");
        }
        let mut state = self.state.lock();
        if state.node.as_ref().is_some_and(|n| n.id == id) {
            state.node = None;
        }
    }

    /// Answers one plugin connection's question.
    async fn answer_plugin(&self, conn: UnixStream) {
        let (read, mut write) = conn.into_split();
        let mut line = String::new();
        let read = BufReader::new(read.take(MAX_LINE as u64))
            .read_line(&mut line)
            .await;
        let answer = match read {
            Err(e) => Answer::failed(format!("reading the question: {e}")),
            Ok(_) => match serde_json::from_str::<Ask>(&line) {
                Err(e) => Answer::failed(format!("not a question this agent knows: {e}")),
                Ok(ask) => self.answer(ask).await,
            },
        };
        let mut text = serde_json::to_string(&answer).unwrap_or_else(|_| "{}".into());
        text.push('\n');
        let _ = write.write_all(text.as_bytes()).await;
    }

    async fn answer(&self, ask: Ask) -> Answer {
        match ask {
            Ask::Add {
                pod,
                container_id,
                netns,
                uncaptured,
            } => self.add(pod, container_id, netns, uncaptured).await,
            Ask::Del { pod, container_id } => self.del(&pod, &container_id).await,
            Ask::Check { pod, container_id } => self.check(&pod, &container_id),
        }
    }

    async fn add(
        &self,
        pod: PodRef,
        container_id: String,
        netns: PathBuf,
        uncaptured: Vec<u16>,
    ) -> Answer {
        let verdict = match &self.kube {
            None if self.flags().enrolls(&pod.namespace) => Verdict::Enroll,
            None => Verdict::Leave(Why::NotAsked),
            Some(w) => match w.verdict(&pod, self.flags()).await {
                Ok(v) => v,
                Err(e) => return Answer::failed(e),
            },
        };
        let id = uid(&pod, &container_id);
        let kept = Kept {
            pod,
            container_id,
            netns,
            inode: None,
            uncaptured,
        };
        if let Verdict::Leave(why) = verdict {
            tracing::info!(k8s.namespace = %kept.pod.namespace, k8s.name = %kept.pod.name, reason = %why, "pod not enrolled: left alone");
            // With Kubernetes, a label may enroll it later: the agent keeps its namespace's path.
            if self.kube.is_some() {
                let mut state = self.state.lock();
                if state.pods.get(&id).is_none_or(|p| p.netns.is_none()) {
                    state.pods.insert(id, Pod { kept, netns: None });
                }
                drop(state);
                self.save();
            }
            return Answer::default();
        }
        let file = match kept.open() {
            Ok(f) => Arc::new(f),
            Err(e) => {
                return Answer::failed(format!(
                    "cannot open the pod's network namespace {}: {e}",
                    kept.netns.display()
                ));
            }
        };
        let (done, outcome) = oneshot::channel();
        let op = Op::Add {
            uid: id.clone(),
            info: info(&kept.pod),
            uncaptured: kept.uncaptured.clone(),
            netns: file.clone(),
            done,
        };
        {
            let mut state = self.state.lock();
            let Some(node) = &state.node else {
                return Answer::failed(
                    "no node proxy is connected to the node agent; the pod starts once one serves it",
                );
            };
            // Sent under the lock, so that ops reach the node proxy in the order of the state.
            if node.ops.send(op).is_err() {
                return Answer::failed("the node proxy went away");
            }
            state.pods.insert(
                id.clone(),
                Pod {
                    kept,
                    netns: Some(file),
                },
            );
        }
        self.save();
        let result = outcome
            .await
            .unwrap_or_else(|_| Err("the node proxy went away".into()));
        match result {
            Ok(()) => {
                tracing::info!(pod = %id, "pod enrolled");
                // Annotated by the reconciliation.
                if let Some(w) = &self.kube {
                    w.kick();
                }
                Answer {
                    enrolled: true,
                    served: true,
                    ..Answer::default()
                }
            }
            Err(e) => {
                self.state.lock().pods.remove(&id);
                self.save();
                tracing::warn!(pod = %id, error = %e, "the node proxy did not take the pod");
                Answer::failed(format!("the node proxy did not take the pod: {e}"))
            }
        }
    }

    async fn del(&self, pod: &PodRef, container_id: &str) -> Answer {
        let id = uid(pod, container_id);
        if self.release(&id, true).await {
            tracing::info!(pod = %id, "pod released");
            if let Some(w) = &self.kube {
                w.kick();
            }
        }
        Answer::default()
    }

    /// Takes pod `key` back from the node proxy if it is enrolled, and forgets it too when
    /// `forget`; whether the agent knew it.
    async fn release(&self, key: &str, forget: bool) -> bool {
        let outcome = {
            let mut state = self.state.lock();
            let State { pods, node } = &mut *state;
            let netns = if forget {
                pods.remove(key).map(|p| p.netns)
            } else {
                pods.get_mut(key).map(|p| p.netns.take())
            };
            let Some(netns) = netns else {
                return false;
            };
            match (netns, node) {
                (Some(_), Some(node)) => {
                    let (done, outcome) = oneshot::channel();
                    let op = Op::Del {
                        uid: key.to_string(),
                        done,
                    };
                    node.ops.send(op).ok().map(|()| outcome)
                }
                _ => None,
            }
        };
        self.save();
        if let Some(outcome) = outcome
            && let Ok(Err(e)) = outcome.await
        {
            tracing::warn!(pod = %key, error = %e, "the node proxy failed to release the pod");
        }
        true
    }

    fn check(&self, pod: &PodRef, container_id: &str) -> Answer {
        let id = uid(pod, container_id);
        let state = self.state.lock();
        let held = state.pods.get(&id).is_some_and(|p| p.netns.is_some());
        // With Kubernetes, the agent's own state is the answer (labels change while pods run).
        if !held && (self.kube.is_some() || !self.flags().enrolls(&pod.namespace)) {
            return Answer::default();
        }
        if !held {
            return Answer::failed(format!(
                "pod {id} of the enrolled namespace {} is not held by the node agent",
                pod.namespace
            ));
        }
        Answer {
            enrolled: true,
            served: state
                .node
                .as_ref()
                .is_some_and(|n| n.replayed.load(Ordering::Acquire)),
            ..Answer::default()
        }
    }
}

/// What the node proxy is told of a pod (it finds the mesh workload by name and namespace).
fn info(pod: &PodRef) -> WorkloadInfo {
    WorkloadInfo {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        service_account: String::new(),
    }
}
