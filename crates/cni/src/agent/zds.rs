//! The agent's side of ZDS (`istio.workload.zds`) with one node proxy: it reads the node
//! proxy's hello, replays every pod it holds (an add with the pod's namespace in SCM_RIGHTS,
//! then `snapshot_sent`), then hands over each change as it comes, one request at a time, each
//! answered by the node proxy's ack.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::zds::{
    AddWorkload, DelWorkload, SnapshotSent, Version, WorkloadInfo, WorkloadRequest,
    WorkloadResponse, ZdsHello, workload_request::Payload, workload_response,
};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio_seqpacket::UnixSeqpacket;
use tokio_seqpacket::ancillary::AncillaryMessageWriter;

/// How long the node proxy may take to answer one request.
pub(crate) const ACK_TIMEOUT: Duration = Duration::from_secs(20);

/// A change for the node proxy, and where its outcome goes (`Err` with the node proxy's error
/// text, or why it was never answered).
#[derive(Debug)]
pub(crate) enum Op {
    Add {
        uid: String,
        info: WorkloadInfo,
        uncaptured: Vec<u16>,
        netns: Arc<File>,
        done: oneshot::Sender<Result<(), String>>,
    },
    Del {
        uid: String,
        done: oneshot::Sender<Result<(), String>>,
    },
}

/// Why a connection to a node proxy ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("the node proxy's hello is not a ZdsHello: {0}")]
    BadHello(String),
    #[error("the node proxy speaks ZDS version {0}; this agent speaks V1")]
    Version(i32),
    #[error("the node proxy went away")]
    Closed,
    #[error("the node proxy did not answer within {ACK_TIMEOUT:?}")]
    Timeout,
    #[error("the node proxy's answer is not an ack: {0}")]
    BadAck(String),
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// One node proxy's connection.
#[derive(Debug)]
pub(crate) struct Link(pub(crate) UnixSeqpacket);

impl Link {
    /// Reads the node proxy's hello and checks its version.
    pub(crate) async fn hello(&self) -> Result<(), LinkError> {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(ACK_TIMEOUT, self.0.recv(&mut buf))
            .await
            .map_err(|_| LinkError::Timeout)??;
        if n == 0 {
            return Err(LinkError::Closed);
        }
        let hello = ZdsHello::decode(&buf[..n]).map_err(|e| LinkError::BadHello(e.to_string()))?;
        if hello.version != Version::V1 as i32 {
            return Err(LinkError::Version(hello.version));
        }
        Ok(())
    }

    /// Sends `payload` (with `fd` in SCM_RIGHTS) and waits for the ack: `Ok(Err(text))` when
    /// the node proxy failed the request.
    pub(crate) async fn request(
        &self,
        payload: Payload,
        fd: Option<&File>,
    ) -> Result<Result<(), String>, LinkError> {
        let bytes = WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec();
        let mut space = [0u8; 64];
        let mut ancillary = AncillaryMessageWriter::new(&mut space);
        if let Some(f) = fd {
            ancillary
                .add_fds(&[f.as_fd()])
                .map_err(|e| LinkError::Io(std::io::Error::other(e.to_string())))?;
        }
        self.0
            .send_vectored_with_ancillary(&[IoSlice::new(&bytes)], &mut ancillary)
            .await?;
        let mut buf = [0u8; 1024];
        let (n, _) = tokio::time::timeout(
            ACK_TIMEOUT,
            self.0
                .recv_vectored_with_ancillary(&mut [IoSliceMut::new(&mut buf)], &mut []),
        )
        .await
        .map_err(|_| LinkError::Timeout)??;
        if n == 0 {
            return Err(LinkError::Closed);
        }
        let response =
            WorkloadResponse::decode(&buf[..n]).map_err(|e| LinkError::BadAck(e.to_string()))?;
        match response.payload {
            Some(workload_response::Payload::Ack(a)) if a.error.is_empty() => Ok(Ok(())),
            Some(workload_response::Payload::Ack(a)) => Ok(Err(a.error)),
            None => Err(LinkError::BadAck("no payload".into())),
        }
    }

    /// An add of pod `uid` in `netns`, with `uncaptured` (Ferry's extension: none from a
    /// plugin's add) left out of its inbound capture.
    pub(crate) async fn add(
        &self,
        uid: &str,
        info: WorkloadInfo,
        uncaptured: &[u16],
        netns: &File,
    ) -> Result<Result<(), String>, LinkError> {
        let add = Payload::Add(AddWorkload {
            uid: uid.to_string(),
            workload_info: Some(info),
            ferry_uncaptured_ports: uncaptured.iter().map(|p| u32::from(*p)).collect(),
        });
        self.request(add, Some(netns)).await
    }

    pub(crate) async fn del(&self, uid: &str) -> Result<Result<(), String>, LinkError> {
        let del = Payload::Del(DelWorkload {
            uid: uid.to_string(),
        });
        self.request(del, None).await
    }

    pub(crate) async fn snapshot_sent(&self) -> Result<Result<(), String>, LinkError> {
        self.request(Payload::SnapshotSent(SnapshotSent {}), None)
            .await
    }

    /// Resolves when the node proxy closes its side (anything it sends unasked is ignored).
    pub(crate) async fn closed(&self) {
        let mut buf = [0u8; 1024];
        loop {
            match self.0.recv(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Carries out `op`, telling its sender how it went.
    pub(crate) async fn carry(&self, op: Op) -> Result<(), LinkError> {
        match op {
            Op::Add {
                uid,
                info,
                uncaptured,
                netns,
                done,
            } => {
                let r = self.add(&uid, info, &uncaptured, &netns).await;
                answer(done, &r);
                r.map(drop)
            }
            Op::Del { uid, done } => {
                let r = self.del(&uid).await;
                answer(done, &r);
                r.map(drop)
            }
        }
    }
}

fn answer(done: oneshot::Sender<Result<(), String>>, r: &Result<Result<(), String>, LinkError>) {
    let _ = done.send(match r {
        Ok(inner) => inner.clone(),
        Err(e) => Err(e.to_string()),
    });
}

/// The sending half a plugin's question uses to reach the connected node proxy (unbounded, so
/// that it is sent to under the agent's lock, in the order of the agent's state).
pub(crate) type OpSender = mpsc::UnboundedSender<Op>;
