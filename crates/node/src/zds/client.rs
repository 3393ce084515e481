//! The ZDS connection to the node agent: connect (again, with a capped backoff), hello, then
//! one ack per request, each request acted on by the node.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::zds::WorkloadInfo;
use ferry_core::model::WorkloadUid;
use ferry_runtime::netns::Netns;
use tokio_seqpacket::UnixSeqpacket;
use tokio_seqpacket::ancillary::OwnedAncillaryMessage;

use super::frames::{self, FrameError, MAX_FRAME};
use super::session::{Action, Aliases, Session, SessionError};
use crate::capture::Uncaptured;
use crate::pods::EnrollError;
use crate::state::{Node, UncapturedConflict};

/// The first wait before connecting again, doubled after each failure up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);

/// The longest wait between two connection attempts (ztunnel's too).
const BACKOFF_MAX: Duration = Duration::from_secs(15);

/// How long an added pod may wait for its workload to appear in the mesh snapshot.
const ADD_WAIT: Duration = Duration::from_secs(10);

/// Why a request failed: the text of its error ack.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("the descriptor is not a network namespace: {0}")]
    NotANamespace(std::io::Error),
    #[error(transparent)]
    Enroll(#[from] EnrollError),
    #[error("{0}; del it first")]
    Uncaptured(#[from] UncapturedConflict),
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    #[error("cannot send to the node agent: {0}")]
    Send(std::io::Error),
    #[error("cannot receive from the node agent: {0}")]
    Receive(std::io::Error),
}

/// How a connection ended without an error.
#[derive(Debug)]
enum Ended {
    /// The agent closed it.
    Closed,
    /// The node proxy is draining.
    Draining,
}

/// One packet from the agent.
#[derive(Debug)]
struct Packet {
    bytes: Vec<u8>,
    fds: Vec<OwnedFd>,
    truncated: bool,
}

/// Room for the ancillary data of a packet: one descriptor, and a few more to be refused
/// rather than cut (`MSG_CTRUNC`). Aligned as a `cmsghdr`, which is read in place.
#[repr(C, align(8))]
struct AncillaryBuffer([u8; 256]);

/// Capped exponential backoff between connection attempts.
#[derive(Debug)]
struct Backoff(Duration);

// === impl Backoff ===

impl Backoff {
    fn next(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(BACKOFF_MAX);
        wait
    }

    fn reset(&mut self) {
        self.0 = BACKOFF_MIN;
    }
}

/// Serves the node agent's requests from `socket` until the node drains. Until the agent's
/// first replay, the first time it cannot be reached (or a connection ends before its replay
/// did), the pods of the state file are served again ([`crate::enrollment`]): the fallback for
/// a node proxy restarted while its agent is away. The agent's replay, when it comes, decides.
pub(crate) async fn run(node: Arc<Node>, socket: PathBuf) {
    let mut backoff = Backoff(BACKOFF_MIN);
    let mut aliases = Aliases::default();
    let mut fell_back = false;
    loop {
        let connected = tokio::select! {
            () = node.drain.draining() => return,
            c = UnixSeqpacket::connect(&socket) => c,
        };
        let wait = match connected {
            Ok(conn) => {
                tracing::info!(zds.socket = %socket.display(), "connected to the node agent");
                match serve(&node, &conn, &mut backoff, &mut aliases).await {
                    Ok(Ended::Draining) => return,
                    Ok(Ended::Closed) => {
                        tracing::warn!(zds.socket = %socket.display(), "the node agent closed the connection; its pods stay served until it replays");
                    }
                    Err(e) => {
                        tracing::warn!(zds.socket = %socket.display(), error = %e, "the connection to the node agent failed; its pods stay served until it replays");
                    }
                }
                // The shortest wait if the agent took requests on it (the backoff was reset),
                // longer each time if it keeps closing connections it took none on.
                backoff.next()
            }
            Err(e) => {
                let wait = backoff.next();
                tracing::warn!(zds.socket = %socket.display(), error = %e, zds.retry_ms = wait.as_millis() as u64, "cannot connect to the node agent");
                wait
            }
        };
        if !fell_back && !replayed(&node) {
            fell_back = true;
            tracing::info!(zds.socket = %socket.display(), "no replay from the node agent: serving the pods of the state file until it replays");
            crate::enrollment::restore(&node).await;
        }
        tokio::select! {
            () = node.drain.draining() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Whether the agent's first replay ended (`snapshot_sent`).
fn replayed(node: &Node) -> bool {
    node.agent_replayed
        .as_ref()
        .is_some_and(|r| r.load(std::sync::atomic::Ordering::Acquire))
}

/// One connection: the hello, then one ack per request.
async fn serve(
    node: &Arc<Node>,
    conn: &UnixSeqpacket,
    backoff: &mut Backoff,
    aliases: &mut Aliases,
) -> Result<Ended, ConnectionError> {
    conn.send(&frames::hello())
        .await
        .map_err(ConnectionError::Send)?;
    let mut session = Session::default();
    loop {
        let packet = tokio::select! {
            () = node.drain.draining() => return Ok(Ended::Draining),
            p = receive(conn) => p.map_err(ConnectionError::Receive)?,
        };
        let Some(packet) = packet else {
            return Ok(Ended::Closed);
        };
        // The agent speaks the protocol: connect promptly next time it goes away.
        backoff.reset();
        let answer = match handle(node, &mut session, aliases, packet).await {
            Ok(()) => frames::ack(None),
            Err(e) => {
                tracing::warn!(error = %e, "node agent request failed");
                frames::ack(Some(&e.to_string()))
            }
        };
        conn.send(&answer).await.map_err(ConnectionError::Send)?;
    }
}

/// Receives one packet; `None` when the agent closed the connection (a packet of no bytes, as
/// ztunnel reads it too).
async fn receive(conn: &UnixSeqpacket) -> std::io::Result<Option<Packet>> {
    // One byte more than any packet accepted: a longer one is cut there and refused.
    let mut bytes = vec![0u8; MAX_FRAME + 1];
    let mut ancillary = AncillaryBuffer([0; 256]);
    let (n, reader) = conn
        .recv_vectored_with_ancillary(&mut [IoSliceMut::new(&mut bytes)], &mut ancillary.0)
        .await?;
    let truncated = reader.is_truncated();
    let mut fds = Vec::new();
    for message in reader.into_messages() {
        if let OwnedAncillaryMessage::FileDescriptors(owned) = message {
            fds.extend(owned);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    bytes.truncate(n);
    Ok(Some(Packet {
        bytes,
        fds,
        truncated,
    }))
}

/// Decodes one packet and does what it asks.
async fn handle(
    node: &Arc<Node>,
    session: &mut Session,
    aliases: &mut Aliases,
    packet: Packet,
) -> Result<(), RequestError> {
    let request = frames::decode(&packet.bytes, packet.fds, packet.truncated)?;
    let mut mesh_uid = None;
    if let frames::Request::Add { uid, info, .. } = &request {
        let mesh = resolve(node, uid, info.as_ref());
        match info {
            Some(i) => {
                tracing::info!(pod = %mesh, zds.uid = %uid, k8s.name = %i.name, k8s.namespace = %i.namespace, k8s.service_account = %i.service_account, "node agent adds a pod")
            }
            None => tracing::info!(pod = %mesh, zds.uid = %uid, "node agent adds a pod"),
        }
        mesh_uid = Some(mesh);
    }
    let action = session.step(request, || {
        agent_pods(node)
            .iter()
            .map(|u| aliases.agent_uid(u))
            .collect()
    })?;
    match action {
        Action::Serve {
            uid,
            netns,
            uncaptured,
        } => {
            let mesh = mesh_uid.unwrap_or_else(|| uid.clone());
            serve_pod(node, &mesh, netns, Uncaptured::new(uncaptured)).await?;
            aliases.insert(uid, mesh);
        }
        Action::Keep => {}
        Action::Release(uid) => {
            release(node, &aliases.take(&uid)).await;
        }
        Action::Reconcile(gone) => {
            tracing::info!(released = gone.len(), "node agent replay over");
            for uid in gone {
                release(node, &aliases.take(&uid)).await;
            }
            // Ready from now on: the agent's pods are served.
            if let Some(replayed) = &node.agent_replayed {
                replayed.store(true, std::sync::atomic::Ordering::Release);
            }
            // What start-up ran (enrolling the replayed pods included) is done.
            crate::memory::started();
        }
    }
    Ok(())
}

/// The mesh's uid of the pod the agent calls `uid`: that uid if the mesh has it, else the one
/// workload on this node with the name and namespace of `info` (Istio's agent sends Kubernetes
/// UIDs), else `uid` (whose workload may still appear).
fn resolve(node: &Node, uid: &str, info: Option<&WorkloadInfo>) -> WorkloadUid {
    let uid = WorkloadUid::new(uid);
    let snap = node.store.load();
    if snap.workload(&uid).is_some() {
        return uid;
    }
    let Some(info) = info else { return uid };
    let mut named = snap.workloads_on_node(&node.name).iter().filter(|u| {
        snap.workload(u)
            .is_some_and(|w| w.name == info.name && w.namespace == info.namespace)
    });
    match (named.next(), named.next()) {
        (Some(one), None) => one.clone(),
        _ => uid,
    }
}

/// The pods the node serves or was asked to serve (every one is the agent's: it is the one
/// enroller; those of the state file were its pods before a restart).
fn agent_pods(node: &Node) -> Vec<WorkloadUid> {
    let mut pods: Vec<WorkloadUid> = node.pods().iter().map(|p| p.uid.clone()).collect();
    pods.extend(node.unserved.lock().keys().cloned());
    pods
}

/// Serves pod `uid` in the namespace `fd` refers to, with `uncaptured` left out of its inbound
/// capture: once, if it is served in that namespace already (with the same ports; other ones
/// are refused); in place of the old one if it is served in another.
async fn serve_pod(
    node: &Arc<Node>,
    uid: &WorkloadUid,
    fd: OwnedFd,
    uncaptured: Uncaptured,
) -> Result<(), RequestError> {
    let file = File::from(fd);
    let id = Netns::id_of(&file).map_err(RequestError::NotANamespace)?;
    let served = node.pods.lock().get(uid).cloned();
    if let Some(pod) = served {
        if pod.netns.id() == id {
            node.set_uncaptured(uid, uncaptured)?;
            tracing::debug!(pod = %uid, "node agent adds a pod served already");
            return Ok(());
        }
        tracing::info!(pod = %uid, "node agent adds a pod in a new network namespace: serving the new one");
        node.remove(uid.as_str()).await;
    }
    node.set_uncaptured(uid, uncaptured)?;
    node.enroll(uid.as_str(), file.into(), ADD_WAIT).await?;
    node.unserved.lock().remove(uid);
    crate::enrollment::save(node);
    Ok(())
}

/// Stops serving pod `uid` (a pod not served is no error: the agent's del is idempotent).
async fn release(node: &Node, uid: &WorkloadUid) {
    let unserved = node.unserved.lock().remove(uid).is_some();
    node.uncaptured.lock().remove(uid);
    if node.remove(uid.as_str()).await || unserved {
        tracing::info!(pod = %uid, "node agent released a pod");
        crate::enrollment::save(node);
    }
}

#[cfg(test)]
mod backoff_tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_resets() {
        let mut b = Backoff(BACKOFF_MIN);
        let waits: Vec<Duration> = (0..10).map(|_| b.next()).collect();
        assert_eq!(waits[0], Duration::from_millis(100));
        assert_eq!(waits[1], Duration::from_millis(200));
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(waits[9], BACKOFF_MAX);
        b.reset();
        assert_eq!(b.next(), BACKOFF_MIN);
    }
}
