//! Accepting connections when file descriptors run out. A listener whose `accept` fails with
//! EMFILE/ENFILE would otherwise leave the connection waiting in the backlog (the client hangs)
//! and spin. The [`Acceptor`] keeps one descriptor in reserve: on exhaustion it gives the
//! reserve up, accepts the waiting connection, resets it at once (the client sees a refusal,
//! not a hang), counts it, takes the reserve back, and backs off briefly.

use std::net::SocketAddr;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};

use crate::telemetry::registered;

/// How long an accept loop pauses after an error it cannot act on.
const BACKOFF: Duration = Duration::from_millis(20);

/// Shared by every accept loop of a process.
#[derive(Debug)]
pub struct Acceptor {
    reserve: parking_lot::Mutex<Option<std::fs::File>>,
    /// Connections refused because the process was out of descriptors
    /// (`ferry_accept_refused_total{reason="fd_limit"}`).
    pub refused_fd_limit: Counter,
    /// Other accept errors (`ferry_accept_errors_total`).
    pub errors: Counter,
}

/// Why a connection was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Reason {
    FdLimit,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedLabels {
    reason: Reason,
}

// === impl Acceptor ===

impl Default for Acceptor {
    /// An acceptor whose counters are not exposed (see [`Acceptor::new`]).
    fn default() -> Self {
        Self {
            reserve: parking_lot::Mutex::new(std::fs::File::open("/dev/null").ok()),
            refused_fd_limit: Counter::default(),
            errors: Counter::default(),
        }
    }
}

impl Acceptor {
    /// An acceptor whose counters are registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let refused: Family<RefusedLabels, Counter> = registered(
            registry,
            "ferry_accept_refused",
            "Connections refused at accept because the process was out of file descriptors",
        );
        // The one series exists from the start, so a scrape shows it at zero.
        let refused_fd_limit = refused.get_or_create_owned(&RefusedLabels {
            reason: Reason::FdLimit,
        });
        Self {
            refused_fd_limit,
            errors: registered(registry, "ferry_accept_errors", "Other accept errors"),
            ..Self::default()
        }
    }

    /// The next connection. Errors are handled here (refused and counted, or backed off from),
    /// so the caller just loops.
    pub async fn accept(&self, listener: &TcpListener, what: &str) -> (TcpStream, SocketAddr) {
        loop {
            match listener.accept().await {
                Ok(c) => return c,
                Err(e) if out_of_descriptors(&e) => {
                    // Linux reports this whether or not a connection is waiting.
                    if self.refuse_one(listener) {
                        tracing::warn!(listener = what, refused_total = self.refused_fd_limit.get(), error = %e, "out of file descriptors: refused a new connection");
                    }
                    tokio::time::sleep(BACKOFF).await;
                }
                Err(e) => {
                    self.errors.inc();
                    tracing::warn!(listener = what, error = %e, "accept failed");
                    tokio::time::sleep(BACKOFF).await;
                }
            }
        }
    }

    /// Frees the reserve descriptor, accepts and resets a waiting connection if there is one,
    /// and takes the reserve back, all without yielding (so no other task of this thread takes
    /// the freed descriptor). Returns whether a connection was refused.
    fn refuse_one(&self, listener: &TcpListener) -> bool {
        let mut reserve = self.reserve.lock();
        drop(reserve.take());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let refused = match listener.poll_accept(&mut cx) {
            std::task::Poll::Ready(Ok((s, _))) => {
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                drop(s);
                self.refused_fd_limit.inc();
                true
            }
            _ => false,
        };
        *reserve = std::fs::File::open("/dev/null").ok();
        refused
    }
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    e.raw_os_error()
        .is_some_and(|n| n == Errno::EMFILE as i32 || n == Errno::ENFILE as i32)
}

// === impl Reason ===

impl EncodeLabelValue for Reason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let value = match self {
            Self::FdLimit => "fd_limit",
        };
        std::fmt::Write::write_str(encoder, value)
    }
}
