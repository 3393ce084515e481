//! `ferry control` as it runs (`app::serve`: the watched topology file, TLS, the local test
//! configuration of [`super::local_config`]) in a directory of its own, for tests and benches:
//! stopped and its directory removed when dropped, pass or fail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::oneshot;

use crate::app::Listening;

/// A running control plane.
#[derive(Debug)]
pub struct Control {
    pub listening: Listening,
    /// The watched topology file.
    pub topology: PathBuf,
    /// Its state directory (CA, node-token key).
    pub state: PathBuf,
    dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Control {
    /// Writes `text` as the topology file in a new directory named after `name` and this
    /// process, and serves it; returns once it listens (at most a minute).
    pub async fn start(name: &str, text: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("ferry-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let topology = dir.join("topology.yaml");
        std::fs::write(&topology, text)
            .with_context(|| format!("writing {}", topology.display()))?;
        let state = dir.join("state");
        let config = super::local_config(&topology, &state);
        let (ready_tx, ready_rx) = oneshot::channel::<Listening>();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            crate::app::serve(
                &config,
                |l| {
                    let _ = ready_tx.send(*l);
                },
                async {
                    let _ = stop_rx.await;
                },
            )
            .await
        });
        let mut control = Self {
            listening: Listening {
                addr: ([127, 0, 0, 1], 0).into(),
                metrics_addr: ([127, 0, 0, 1], 0).into(),
                plaintext: false,
            },
            topology,
            state,
            dir,
            stop: Some(stop),
            task,
        };
        control.listening = tokio::time::timeout(Duration::from_secs(60), ready_rx)
            .await
            .context("the control plane did not listen within a minute")?
            .context("the control plane stopped before it listened")?;
        Ok(control)
    }

    /// The trust bundle (PEM) that verifies it.
    pub fn bundle(&self) -> anyhow::Result<String> {
        crate::app::bundle(&self.state, "cluster.local")
    }

    /// Node `node`'s bootstrap token.
    pub fn token(&self, node: &str) -> anyhow::Result<String> {
        crate::app::node_token(&self.state, node)
    }

    /// Replaces the topology file in one step (written aside, renamed over), as editors and
    /// config managers do.
    pub fn replace(&self, text: &str) -> anyhow::Result<()> {
        replace(&self.topology, text)
    }
}

fn replace(path: &Path, text: &str) -> anyhow::Result<()> {
    let aside = path.with_extension("yaml.tmp");
    std::fs::write(&aside, text).with_context(|| format!("writing {}", aside.display()))?;
    std::fs::rename(&aside, path).with_context(|| format!("renaming over {}", path.display()))
}

impl Drop for Control {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
