//! Per-connection policy re-checks, driven by snapshot changes (linkerd2-proxy's
//! `policy.changed()` shape): a connection that was allowed waits on the change signal next to
//! its copy, and re-runs its own authorization each time the mesh changes; the first denial
//! ends it. No registry of connections, no global task, no polling.

use ferry_hbone::upstream::Until;
use tokio::sync::watch;

use crate::conn::Denial;

/// Resolves with the first denial `check` returns after a change on `changes`.
///
/// Only changes after the one `changes` has last seen count: take it (clone and
/// `borrow_and_update`) *before* loading the snapshot the connection was admitted on, so that
/// no change between that check and this wait is missed. If the sender is gone (no more
/// changes can come), never resolves.
pub fn until_denied<C>(
    changes: watch::Receiver<C>,
    check: impl Fn() -> Result<(), Denial>,
) -> impl Future<Output = Denial> {
    denied_then(changes, check, std::convert::identity)
}

/// [`until_denied`] as the interruption an HBONE [`Forward`](ferry_hbone::upstream::Forward)
/// waits on. Boxed once, with no future wrapped around another: a held connection keeps this
/// for its whole life, and every layer of `async` would store the check's state again.
///
/// The check's error ends the copy as it is boxed: a [`Denial`] (what
/// [`ConnError::from_outcome`](crate::conn::ConnError::from_outcome) reads back), or another
/// reason its caller reads back itself (a boxed error is passed on as it is).
pub fn interrupt_on_denial<C, E>(
    changes: watch::Receiver<C>,
    check: impl Fn() -> Result<(), E> + Send + 'static,
) -> Until
where
    C: Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
{
    Box::pin(denied_then(changes, check, Into::into))
}

/// A plain function returning its future: an `async fn` would store `changes` and `check`
/// twice, for as long as the connection is held.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn stores its arguments twice, for as long as a connection is held"
)]
fn denied_then<C, E, T, F, W>(
    mut changes: watch::Receiver<C>,
    check: F,
    wrap: W,
) -> impl Future<Output = T>
where
    F: Fn() -> Result<(), E>,
    W: FnOnce(E) -> T,
{
    async move {
        loop {
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
            if let Err(denial) = check() {
                return wrap(denial);
            }
        }
    }
}

/// A change receiver that has seen every change so far: the one to hand [`until_denied`] for a
/// connection about to be checked.
pub fn from_now<C>(changes: &watch::Receiver<C>) -> watch::Receiver<C> {
    let mut rx = changes.clone();
    rx.borrow_and_update();
    rx
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;
    use crate::conn::tests::denial;

    #[tokio::test]
    async fn a_connection_is_checked_on_each_change_and_ended_by_the_first_denial() {
        let (tx, rx) = watch::channel(0u64);
        tx.send(1).unwrap();
        // Changes before it was taken do not count.
        let rx = from_now(&rx);
        let (checks, deny) = (
            Arc::new(AtomicU32::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let task = tokio::spawn({
            let (checks, deny) = (checks.clone(), deny.clone());
            until_denied(rx, move || {
                checks.fetch_add(1, Ordering::SeqCst);
                if deny.load(Ordering::SeqCst) {
                    Err(denial())
                } else {
                    Ok(())
                }
            })
        });
        tx.send(2).unwrap();
        // Allowed: it keeps waiting (polled until the check has run).
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while checks.load(Ordering::SeqCst) < 1 {
            assert!(tokio::time::Instant::now() < deadline, "never re-checked");
            tokio::task::yield_now().await;
        }
        assert!(!task.is_finished());
        deny.store(true, Ordering::SeqCst);
        tx.send(3).unwrap();
        let d = tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("ended by the denial")
            .unwrap();
        assert_eq!(d, denial());
        assert_eq!(checks.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_sender_it_never_ends() {
        let (tx, rx) = watch::channel(0u64);
        drop(tx);
        let waited = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            until_denied(rx, || Err(denial())),
        )
        .await;
        assert!(waited.is_err());
    }

    #[tokio::test]
    async fn the_interruption_of_a_tunnel_carries_the_denial() {
        let (tx, rx) = watch::channel(0u64);
        let until = interrupt_on_denial(from_now(&rx), || Err(denial()));
        tx.send(1).unwrap();
        let reason = tokio::time::timeout(std::time::Duration::from_secs(5), until)
            .await
            .expect("ended by the denial");
        assert_eq!(reason.to_string(), denial().to_string());
    }
}
