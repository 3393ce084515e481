//! The nf_tables ruleset generation of a pod's network namespace: a 32-bit number the kernel
//! bumps on every committed ruleset change in that namespace (any table, any family; the
//! iptables-nft commands are such commits). Asking for it (`NFT_MSG_GETGEN` on a
//! NETLINK_NETFILTER socket opened inside the namespace) is one system call each way, where
//! reading the rules themselves is a fork and exec of `nsenter ... iptables-save`: so the
//! safety comparison of a pod's capture rules ([`crate::pods`]) runs in full only when the
//! generation moved since the last comparison that found (or made) the rules Ferry's.
//!
//! It means nothing where iptables is the legacy backend (its rules are no nf_tables
//! commits): [`nft_backend`] tells, once per process.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use ferry_runtime::netns::Netns;
use netlink_packet_core::{NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nftables::{GenAttribute, GenMessage, NfTablesMessage};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

/// How long the kernel's reply may take, in seconds (it is sent before the request's `send`
/// returns).
const REPLY_WITHIN_S: i64 = 1;

/// Why the generation could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GenerationError {
    #[error("netlink socket: {0}")]
    Io(#[from] io::Error),
    #[error("malformed reply ({len} bytes): {detail}")]
    Malformed { len: usize, detail: String },
    #[error("the kernel refused NFT_MSG_GETGEN: {0}")]
    Refused(io::Error),
    #[error("reply to request {got}, not to ours ({sent})")]
    OtherRequest { sent: u32, got: u32 },
    #[error("a reply that is no nf_tables generation: {0}")]
    Unexpected(String),
    #[error("a generation reply without its id (NFTA_GEN_ID)")]
    NoId,
}

/// The `NFT_MSG_GETGEN` request numbered `seq`, as sent.
pub(crate) fn request(seq: u32) -> Vec<u8> {
    let mut msg = NetlinkMessage::from(NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
        NfTablesMessage::GetGen(GenMessage { attributes: vec![] }),
    ));
    msg.header.flags = NLM_F_REQUEST;
    msg.header.sequence_number = seq;
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

/// The generation in `reply`, the kernel's answer to request `seq` ([`request`]): an error
/// naming what is wrong with any other reply, never a panic.
pub(crate) fn parse(reply: &[u8], seq: u32) -> Result<u32, GenerationError> {
    let msg = NetlinkMessage::<NetfilterMessage>::deserialize(reply).map_err(|e| {
        GenerationError::Malformed {
            len: reply.len(),
            detail: e.to_string(),
        }
    })?;
    if msg.header.sequence_number != seq {
        return Err(GenerationError::OtherRequest {
            sent: seq,
            got: msg.header.sequence_number,
        });
    }
    let attributes = match msg.payload {
        NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewGen(g)),
            ..
        }) => g.attributes,
        NetlinkPayload::Error(e) if e.code.is_some() => {
            return Err(GenerationError::Refused(e.to_io()));
        }
        other => return Err(GenerationError::Unexpected(format!("{other:?}"))),
    };
    attributes
        .iter()
        .find_map(|a| match a {
            GenAttribute::Id(id) => Some(*id),
            _ => None,
        })
        .ok_or(GenerationError::NoId)
}

/// A NETLINK_NETFILTER socket inside one namespace, kept open to ask for its generation.
#[derive(Debug)]
pub(crate) struct Generation {
    socket: Arc<Socket>,
    seq: AtomicU32,
}

// === impl Generation ===

impl Generation {
    /// Opens the socket inside `netns` (a netlink socket answers for the namespace it was
    /// created in, whichever thread uses it later).
    pub(crate) async fn open(netns: &Netns) -> io::Result<Self> {
        let socket = netns
            .run(|| -> io::Result<Socket> {
                let mut s = Socket::new(NETLINK_NETFILTER)?;
                s.bind_auto()?;
                s.connect(&SocketAddr::new(0, 0))?;
                nix::sys::socket::setsockopt(
                    &s,
                    nix::sys::socket::sockopt::ReceiveTimeout,
                    &nix::sys::time::TimeVal::new(REPLY_WITHIN_S, 0),
                )?;
                Ok(s)
            })
            .await??;
        Ok(Self {
            socket: Arc::new(socket),
            seq: AtomicU32::new(1),
        })
    }

    /// The namespace's ruleset generation now. Asked on `netns`'s thread (the socket blocks
    /// for the reply, up to [`REPLY_WITHIN_S`]).
    pub(crate) async fn read(&self, netns: &Netns) -> Result<u32, GenerationError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let socket = self.socket.clone();
        netns.run(move || ask(&socket, seq)).await?
    }
}

/// Sends request `seq` and reads replies until its own (an earlier request's late reply is
/// skipped).
fn ask(socket: &Socket, seq: u32) -> Result<u32, GenerationError> {
    socket.send(&request(seq), 0)?;
    // A reply is 44 bytes; a longer one is cut here, and then malformed.
    let mut buf = Vec::with_capacity(512);
    loop {
        buf.clear();
        socket.recv(&mut buf, 0)?;
        match parse(&buf, seq) {
            Err(GenerationError::OtherRequest { got, .. }) if got < seq => {}
            r => return r,
        }
    }
}

/// Whether a pod's rules need a comparison on a timer: not while iptables is iptables-nft
/// (`nft`) and both the nf_tables events (`rule_events`) and the routing events (`route_events`)
/// are heard, since each change of what is compared sends one and a lost one is an overrun
/// the socket reports (counted as a change).
pub(crate) fn needs_safety_check(nft: bool, rule_events: bool, route_events: bool) -> bool {
    !(nft && rule_events && route_events)
}

/// Whether a pod's rules are to be compared in full: after a change `event`; and on a safety
/// check unless the routing events are still heard (`route_events`: the routing half has no
/// generation) and the generation read `now` is the one `checked` before the last comparison
/// that left the rules Ferry's (none yet, or unreadable: compared).
pub(crate) fn compare_in_full(
    event: bool,
    route_events: bool,
    checked: Option<u32>,
    now: Option<u32>,
) -> bool {
    event || !route_events || now.is_none() || now != checked
}

/// Whether the host's `iptables` and `ip6tables` are the nf_tables backend (their changes
/// move the generation), asked once per process (`iptables -V`); logged once if not.
pub(crate) async fn nft_backend() -> bool {
    static NFT: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
    *NFT.get_or_init(|| async {
        let mut versions = Vec::new();
        for tool in ["iptables", "ip6tables"] {
            let v = tokio::process::Command::new(tool)
                .arg("-V")
                .output()
                .await
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_else(|e| format!("{tool}: {e}"));
            versions.push(v);
        }
        let nft = versions.iter().all(|v| v.contains("(nf_tables)"));
        if !nft {
            tracing::warn!(versions = ?versions, "iptables is not the nf_tables backend: every pod's capture rules are read in full (iptables-save) every 30 s");
        }
        nft
    })
    .await
}

#[cfg(test)]
#[path = "generation_tests.rs"]
mod tests;
