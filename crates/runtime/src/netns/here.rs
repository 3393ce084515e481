//! Opening a socket in another network namespace on the calling thread, without a hop to the
//! namespace's own thread: enter the namespace, create the socket, return. Only `socket()`
//! needs the namespace (a socket belongs to the namespace of the thread that creates it);
//! options, `bind` and `connect` work on any thread. Istio's ztunnel opens its in-pod sockets
//! the same way.
//!
//! A thread left in a pod's namespace would open every later socket there, so returning is
//! never allowed to fail silently: if the thread cannot go back, the process aborts.

use std::cell::OnceCell;
use std::fs::File;
use std::io;

use nix::sched::{CloneFlags, setns};

thread_local! {
    /// The namespace this thread was in when it first entered another: where it returns to.
    /// Opened once per thread, always while the thread is at home (it is opened before the
    /// first entry, and every entry returns before the next).
    static HOME: OnceCell<File> = const { OnceCell::new() };
}

/// Runs `f` (which should create a socket and nothing more) with the calling thread in the
/// namespace `ns` refers to, and brings the thread back to its own namespace before returning.
pub(super) fn in_namespace<T>(ns: &File, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    HOME.with(|home| {
        let home = match home.get() {
            Some(h) => h,
            None => {
                let own = File::open("/proc/thread-self/ns/net").map_err(|e| {
                    saying(
                        &e,
                        "opening this thread's network namespace (/proc/thread-self/ns/net)",
                    )
                })?;
                home.get_or_init(|| own)
            }
        };
        setns(ns, CloneFlags::CLONE_NEWNET)
            .map_err(|e| saying(&e.into(), "entering a pod's network namespace"))?;
        let _back = Return(home);
        f()
    })
}

/// Brings the thread back to its namespace when dropped (also if `f` unwound).
struct Return<'a>(&'a File);

impl Drop for Return<'_> {
    fn drop(&mut self) {
        if let Err(e) = setns(self.0, CloneFlags::CLONE_NEWNET) {
            // Also straight to stderr: the log's writer thread dies with the process, maybe
            // before it wrote this line.
            eprintln!("ferry: cannot return a thread to its own network namespace ({e}); aborting");
            tracing::error!(
                error = %e,
                "cannot return a thread to its own network namespace after opening a socket in a \
                 pod's; aborting, since every later socket of this thread would be opened in the \
                 pod's namespace"
            );
            std::process::abort();
        }
    }
}

/// An error of the same kind that says what was being done.
fn saying(e: &io::Error, doing: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{doing}: {e}"))
}
