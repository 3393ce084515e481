//! Why a proxied connection failed: the side that failed, the response flag operators filter
//! on, and the cause, typed from the layer that saw it ([`ConnError`]).
//!
//! The access log's `error` and `response_flags` fields come from it, and so do the metrics'
//! `response_flags` label, with one rule: a connection's opened and closed counters are kept
//! under the label set it opened with, so the flag in the metrics is the one known when the
//! connection was counted open (`-` for a connection that then ends with a reset; a failure
//! before it was counted open counts it opened and closed under that failure's flag). The
//! access log gets the flag of how the connection really ended.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use ferry_core::authz::Verdict;
use ferry_core::hop::OriginError;
use ferry_core::inbound::InboundError;
use ferry_core::ports::RecursiveCall;
use ferry_core::route::RouteError;
use ferry_hbone::copy::{CopyError, Failed, Interrupted, RelayError};
use ferry_hbone::headers::Refusal;
use ferry_hbone::server::{Ended, Outcome};
use ferry_hbone::{Error as HboneError, Side};
use ferry_tls::certs::CertError;

/// Istio's `response_flags`: what a connection's metrics and access log say about how it
/// ended. The strings are the ones Istio's data plane (and Envoy's long names) use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResponseFlag {
    /// `-`: no failure.
    #[default]
    None,
    /// `DENY`: denied by an authorization policy (at open, or by a policy change later).
    Deny,
    /// `NoRoute`: no destination, endpoint or plan for the connection.
    NoRoute,
    /// `ConnectionFailure`: the next hop (the pod, a node proxy, a waypoint, a gateway) could
    /// not be reached, or no tunnel could be opened to it.
    ConnectionFailure,
    /// `UpstreamConnectionTermination`: the upstream broke (reset) after the connection was up.
    UpstreamTermination,
    /// `DownstreamConnectionTermination`: the downstream broke after the connection was up.
    DownstreamTermination,
    /// `StreamIdleTimeout`: half-closed and quiet past the idle bound; both sides were reset.
    IdleTimeout,
}

/// A denial by policy: the verdict that denied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denial(pub Verdict);

/// What failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnErrorKind {
    #[error(transparent)]
    Hbone(#[from] HboneError),
    /// One tunnel of several (double HBONE: the outer one, or the inner one).
    #[error("{hop}: {source}")]
    Tunnel {
        hop: &'static str,
        source: HboneError,
    },
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error(transparent)]
    Inbound(#[from] InboundError),
    #[error(transparent)]
    Recursive(#[from] RecursiveCall),
    #[error(transparent)]
    Denied(#[from] Denial),
    /// The scope of what the tunnel asks for does not admit the cluster its peer proves.
    #[error(transparent)]
    OutOfScope(#[from] OriginError),
    /// Allowed when it opened, denied by a policy change while open (after moving these bytes).
    #[error("connection closed: no longer allowed by policy ({denial})")]
    PolicyChanged {
        denial: Denial,
        a_to_b: u64,
        b_to_a: u64,
    },
    #[error("no certificate: {0}")]
    Certificate(#[from] CertError),
    #[error("the captured connection has no original destination: {0}")]
    NoOriginalDst(io::Error),
    #[error("the source pod left the mesh")]
    SourceLeft,
    #[error("TCP connect to {addr} failed: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    /// A copy that failed once the connection was up: one side broke, or both were reset at
    /// the half-closed idle bound.
    #[error(
        "{} failed after {a_to_b} bytes sent and {b_to_a} received: {source}",
        match failed { Failed::A => "the downstream", Failed::B => "the upstream" }
    )]
    Relay {
        failed: Failed,
        a_to_b: u64,
        b_to_a: u64,
        source: io::Error,
    },
    #[error("{doing}: {source}")]
    Io {
        doing: &'static str,
        source: io::Error,
    },
}

/// A connection's failure: which side failed, its response flag, and what happened.
#[derive(Debug, thiserror::Error)]
#[error("{} side failed: {kind}", side_name(self.side))]
pub struct ConnError {
    pub side: Side,
    pub flag: ResponseFlag,
    #[source]
    pub kind: ConnErrorKind,
}

/// A side's name in messages and the access log's `error.side`.
pub fn side_name(side: Side) -> &'static str {
    match side {
        Side::Downstream => "downstream",
        Side::Upstream => "upstream",
        Side::Local => "local",
    }
}

// === impl ResponseFlag ===

impl ResponseFlag {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "-",
            Self::Deny => "DENY",
            Self::NoRoute => "NoRoute",
            Self::ConnectionFailure => "ConnectionFailure",
            Self::UpstreamTermination => "UpstreamConnectionTermination",
            Self::DownstreamTermination => "DownstreamConnectionTermination",
            Self::IdleTimeout => "StreamIdleTimeout",
        }
    }
}

impl fmt::Display for ResponseFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ResponseFlag> for String {
    fn from(f: ResponseFlag) -> Self {
        f.as_str().into()
    }
}

// === impl ConnError ===

impl ConnError {
    pub fn new(side: Side, flag: ResponseFlag, kind: impl Into<ConnErrorKind>) -> Self {
        Self {
            side,
            flag,
            kind: kind.into(),
        }
    }

    /// The same failure under another flag.
    pub(crate) fn with_flag(mut self, flag: ResponseFlag) -> Self {
        self.flag = flag;
        self
    }

    /// A tunnel's set-up failed on `hop` (e.g. "outer tunnel to the gateway").
    pub fn tunnel(hop: &'static str, source: HboneError) -> Self {
        Self::new(
            source.side(),
            ResponseFlag::ConnectionFailure,
            ConnErrorKind::Tunnel { hop, source },
        )
    }

    /// Whether another endpoint of the same decision may be tried after this failure: only
    /// when the next hop could not be reached or would not carry the tunnel before any byte
    /// went to it (refused, reset or timed out while connecting or in the handshake, HBONE
    /// 502/503/504). Never after a denial (403), a wrong peer identity, or a failure of our
    /// own side, and never once bytes have moved.
    pub fn retryable(&self) -> bool {
        fn hbone(e: &HboneError) -> bool {
            match e {
                HboneError::Connect { .. }
                | HboneError::Handshake { .. }
                | HboneError::H2 { .. }
                | HboneError::Timeout { .. } => true,
                HboneError::Refused { status, .. } => matches!(status, 502..=504),
                HboneError::PeerIdentity { .. }
                | HboneError::PeerCertificate { .. }
                | HboneError::Alpn { .. }
                | HboneError::BadAuthority(_)
                | HboneError::Config(_) => false,
            }
        }
        self.side == Side::Upstream
            && self.flag == ResponseFlag::ConnectionFailure
            && match &self.kind {
                ConnErrorKind::Connect { .. } => true,
                ConnErrorKind::Hbone(e) | ConnErrorKind::Tunnel { source: e, .. } => hbone(e),
                _ => false,
            }
    }

    /// The bytes moved (sent, received) before a copy failed; none for any other failure.
    pub fn moved(&self) -> (u64, u64) {
        match &self.kind {
            ConnErrorKind::Relay { a_to_b, b_to_a, .. }
            | ConnErrorKind::PolicyChanged { a_to_b, b_to_a, .. } => (*a_to_b, *b_to_a),
            _ => (0, 0),
        }
    }

    /// A failed TCP connect to the next hop.
    pub fn connect(addr: SocketAddr, source: io::Error) -> Self {
        Self::new(
            Side::Upstream,
            ResponseFlag::ConnectionFailure,
            ConnErrorKind::Connect { addr, source },
        )
    }

    /// An I/O failure on `side` while `doing` something (not a connect, not a copy).
    pub fn io(side: Side, doing: &'static str, source: io::Error) -> Self {
        let flag = match side {
            Side::Upstream => ResponseFlag::ConnectionFailure,
            Side::Downstream => ResponseFlag::DownstreamTermination,
            Side::Local => ResponseFlag::None,
        };
        Self::new(side, flag, ConnErrorKind::Io { doing, source })
    }

    pub fn no_original_dst(source: io::Error) -> Self {
        Self::new(
            Side::Local,
            ResponseFlag::NoRoute,
            ConnErrorKind::NoOriginalDst(source),
        )
    }

    pub fn source_left() -> Self {
        Self::new(
            Side::Local,
            ResponseFlag::NoRoute,
            ConnErrorKind::SourceLeft,
        )
    }

    /// An open connection that a policy change denied, after moving (sent, received) bytes.
    pub fn policy_changed(denial: Denial, (a_to_b, b_to_a): (u64, u64)) -> Self {
        Self::new(
            Side::Local,
            ResponseFlag::Deny,
            ConnErrorKind::PolicyChanged {
                denial,
                a_to_b,
                b_to_a,
            },
        )
    }

    /// How a served HBONE tunnel failed, from what the server reports; `None` if it completed.
    /// A handler that failed the tunnel itself (in `connect`) keeps its own error instead.
    pub fn from_outcome(outcome: &Outcome<'_>) -> Option<Self> {
        match &outcome.ended {
            Ended::Complete => None,
            Ended::Refused(r) => Some(Self::from(*r)),
            Ended::ClientGone(e) => Some(Self::io(
                Side::Downstream,
                "answering the CONNECT",
                io::Error::other(e.to_string()),
            )),
            Ended::Reset(e) => Some(Self::from(*e)),
            Ended::Closed(reason) => Some(match reason.downcast_ref::<Denial>() {
                Some(d) => Self::policy_changed(d.clone(), (outcome.sent, outcome.received)),
                None => Self::io(
                    Side::Local,
                    "closed by the handler",
                    io::Error::other(reason.to_string()),
                ),
            }),
        }
    }

    /// The HTTP refusal a CONNECT gets for this failure.
    pub fn refusal(&self) -> Refusal {
        match &self.kind {
            ConnErrorKind::Denied(_)
            | ConnErrorKind::PolicyChanged { .. }
            | ConnErrorKind::OutOfScope(_) => Refusal::Denied(self.kind.to_string()),
            ConnErrorKind::Inbound(e) if e.is_bad_request() => {
                Refusal::BadRequest(self.kind.to_string())
            }
            ConnErrorKind::Recursive(_) | ConnErrorKind::Hbone(HboneError::BadAuthority(_)) => {
                Refusal::BadRequest(self.kind.to_string())
            }
            _ => Refusal::Unavailable(self.kind.to_string()),
        }
    }
}

impl From<HboneError> for ConnError {
    /// Set-up of a tunnel: its side is the error's own; it failed reaching the next hop.
    fn from(e: HboneError) -> Self {
        Self::new(e.side(), ResponseFlag::ConnectionFailure, e)
    }
}

impl From<RouteError> for ConnError {
    fn from(e: RouteError) -> Self {
        Self::new(Side::Local, ResponseFlag::NoRoute, e)
    }
}

impl From<InboundError> for ConnError {
    fn from(e: InboundError) -> Self {
        let side = if e.is_bad_request() {
            Side::Downstream
        } else {
            Side::Local
        };
        Self::new(side, ResponseFlag::NoRoute, e)
    }
}

impl From<RecursiveCall> for ConnError {
    fn from(e: RecursiveCall) -> Self {
        Self::new(Side::Downstream, ResponseFlag::NoRoute, e)
    }
}

impl From<Denial> for ConnError {
    fn from(d: Denial) -> Self {
        Self::new(Side::Local, ResponseFlag::Deny, d)
    }
}

impl From<OriginError> for ConnError {
    /// Refused for scope: flagged as a denial (Istio has no flag of its own for it).
    fn from(e: OriginError) -> Self {
        Self::new(Side::Local, ResponseFlag::Deny, e)
    }
}

impl From<CertError> for ConnError {
    /// Without our certificate no tunnel can be opened: flagged as a failure to connect.
    fn from(e: CertError) -> Self {
        Self::new(Side::Local, ResponseFlag::ConnectionFailure, e)
    }
}

impl From<RelayError> for ConnError {
    fn from(e: RelayError) -> Self {
        Self::from(e.copy)
    }
}

impl From<&RelayError> for ConnError {
    /// From a relay error seen by reference (the HBONE server keeps it): the I/O error is
    /// carried as its kind and message.
    fn from(e: &RelayError) -> Self {
        let c = &e.copy;
        Self::from(CopyError {
            failed: c.failed,
            source: io::Error::new(c.source.kind(), c.source.to_string()),
            a_to_b: c.a_to_b,
            b_to_a: c.b_to_a,
        })
    }
}

impl From<CopyError> for ConnError {
    /// Side A of a copy is the downstream, B the upstream (the order every proxy copies in);
    /// the half-closed idle bound is ours (both sides were reset).
    fn from(c: CopyError) -> Self {
        let (side, flag) = match c.failed {
            _ if c.timed_out() => (Side::Local, ResponseFlag::IdleTimeout),
            Failed::A => (Side::Downstream, ResponseFlag::DownstreamTermination),
            Failed::B => (Side::Upstream, ResponseFlag::UpstreamTermination),
        };
        Self::new(
            side,
            flag,
            ConnErrorKind::Relay {
                failed: c.failed,
                a_to_b: c.a_to_b,
                b_to_a: c.b_to_a,
                source: c.source,
            },
        )
    }
}

impl From<&Refusal> for ConnError {
    /// A refusal the handler's `connect` answered (for handlers that keep no error of their
    /// own): the target could not be reached.
    fn from(r: &Refusal) -> Self {
        let flag = match r {
            Refusal::Denied(_) => ResponseFlag::Deny,
            Refusal::Unavailable(_) => ResponseFlag::ConnectionFailure,
            Refusal::BadRequest(_) | Refusal::MethodNotAllowed(_) => ResponseFlag::NoRoute,
        };
        Self::io(Side::Upstream, "refused", io::Error::other(r.to_string())).with_flag(flag)
    }
}

/// A relay ended by its policy re-check, or failed: one error either way.
impl From<Interrupted<Denial>> for ConnError {
    fn from(e: Interrupted<Denial>) -> Self {
        match e {
            Interrupted::Failed(e) => Self::from(e),
            Interrupted::Until {
                reason,
                a_to_b,
                b_to_a,
            } => Self::policy_changed(reason, (a_to_b, b_to_a)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
