//! One drain primitive for every listener of a process: graceful first, forced at a deadline.
//!
//! ```text
//!   serving ──SIGTERM──▶ draining ──deadline──▶ finishing ──grace──▶ stopped
//!                        │                      │
//!                        │ listeners stop;       │ every connection still open is ended
//!                        │ HBONE peers get a     │ cleanly: FIN towards apps, END_STREAM in
//!                        │ GOAWAY; open          │ tunnels (never a reset); peers get the
//!                        │ connections go on     │ grace to finish their side
//!                        ▼                      ▼
//!               all tracked tasks done ─────────────────────────▶ stopped (early)
//! ```
//!
//! Every connection task is spawned through [`DrainWatcher::spawn`], so the trigger waits on
//! the tasks themselves ending (an event), never on a counter it polls.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

/// Starts the drain. Held by the composition root.
#[derive(Debug)]
pub struct DrainTrigger {
    drain: watch::Sender<bool>,
    finish: watch::Sender<bool>,
    tasks: TaskTracker,
}

/// Handed to every listener and connection: tells them when to stop, and tracks their tasks.
#[derive(Clone, Debug)]
pub struct DrainWatcher {
    drain: watch::Receiver<bool>,
    finish: watch::Receiver<bool>,
    tasks: TaskTracker,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// Tasks still running at the deadline (ended with FIN / END_STREAM then).
    pub(crate) left_at_deadline: usize,
    /// Tasks still running after the grace that followed.
    pub(crate) left_after_grace: usize,
}

/// A new drain pair.
pub fn new() -> (DrainTrigger, DrainWatcher) {
    let (drain, drain_rx) = watch::channel(false);
    let (finish, finish_rx) = watch::channel(false);
    let tasks = TaskTracker::new();
    (
        DrainTrigger {
            drain,
            finish,
            tasks: tasks.clone(),
        },
        DrainWatcher {
            drain: drain_rx,
            finish: finish_rx,
            tasks,
        },
    )
}

/// How long, past the drain deadline, peers get to finish their side of connections that were
/// ended with a FIN (a tunnel waits up to 5 s for its peer's END_STREAM).
pub(crate) const FINISH_GRACE: Duration = Duration::from_secs(6);

// === impl DrainTrigger ===

impl DrainTrigger {
    /// Waits for SIGTERM or SIGINT, then drains with `deadline` and [`FINISH_GRACE`], logging
    /// the start and the end (`what` names the program).
    pub async fn on_signal(self, what: &'static str, deadline: Duration) -> Drained {
        crate::shutdown_signal().await;
        tracing::info!(
            program = what,
            drain_s = deadline.as_secs(),
            running = self.tasks.len(),
            "draining"
        );
        let drained = self.drain(deadline, FINISH_GRACE).await;
        tracing::info!(
            program = what,
            left_at_deadline = drained.left_at_deadline,
            left_after_grace = drained.left_after_grace,
            "drained"
        );
        drained
    }

    /// Drains: tells every watcher to stop accepting, waits up to `deadline` for the tracked
    /// tasks to end, then tells them to finish and waits up to `grace` more.
    pub async fn drain(self, deadline: Duration, grace: Duration) -> Drained {
        self.drain.send_replace(true);
        self.tasks.close();
        let _ = tokio::time::timeout(deadline, self.tasks.wait()).await;
        let left_at_deadline = self.tasks.len();
        if left_at_deadline > 0 {
            tracing::info!(
                left = left_at_deadline,
                "drain deadline: ending the remaining connections with FIN"
            );
            self.finish.send_replace(true);
            let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
        }
        Drained {
            left_at_deadline,
            left_after_grace: self.tasks.len(),
        }
    }
}

// === impl DrainWatcher ===

impl DrainWatcher {
    /// Resolves once the drain starts (at once if it has).
    pub async fn draining(&self) {
        let mut rx = self.drain.clone();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Turns true when the drain starts (what an HBONE server sends its GOAWAY on).
    pub(crate) fn drain_signal(&self) -> watch::Receiver<bool> {
        self.drain.clone()
    }

    /// Turns true at the drain deadline (what copies end cleanly on).
    pub fn finish_signal(&self) -> watch::Receiver<bool> {
        self.finish.clone()
    }

    /// Spawns a connection's task; the drain waits for it.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ends_early_when_the_tasks_end() {
        let (trigger, watcher) = new();
        let w = watcher.clone();
        watcher.spawn(async move { w.draining().await });
        let d = trigger
            .drain(Duration::from_secs(30), Duration::from_secs(5))
            .await;
        assert_eq!(
            d,
            Drained {
                left_at_deadline: 0,
                left_after_grace: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn finishes_what_is_left_at_the_deadline() {
        let (trigger, watcher) = new();
        let w = watcher.clone();
        // Ignores the drain; ends only when told to finish.
        watcher.spawn(async move {
            let _ = w.finish_signal().wait_for(|d| *d).await;
        });
        // Ignores everything.
        watcher.spawn(std::future::pending::<()>());
        let started = tokio::time::Instant::now();
        let d = trigger
            .drain(Duration::from_secs(30), Duration::from_secs(5))
            .await;
        assert_eq!(
            d,
            Drained {
                left_at_deadline: 2,
                left_after_grace: 1
            }
        );
        assert_eq!(started.elapsed(), Duration::from_secs(35));
    }
}
