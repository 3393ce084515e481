//! The topology file as the control plane's source of truth, watched for edits.
//!
//! An edit is loaded and validated off to the side; a good one replaces the snapshot and the
//! served resources in one step each, a bad one is logged with its located errors and the last
//! good state keeps being served.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::store::Store;
use ferry_xds::resources::ResourceSet;
use tokio::sync::watch;

use crate::flatten::resource_set;

/// What the watcher has done, for tests and admin output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloads {
    pub applied: u64,
    pub rejected: u64,
    pub last_error: Option<String>,
}

/// Polls `path` every `every`; publishes each valid edit to `store` and `resources`.
pub async fn watch_file(
    path: PathBuf,
    store: Arc<Store>,
    resources: watch::Sender<Arc<ResourceSet>>,
    every: Duration,
    reloads: watch::Sender<Reloads>,
) {
    let mut last = fingerprint(&path);
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let now = fingerprint(&path);
        if now == last {
            continue;
        }
        last = now;
        match ferry_topology::load_file(&path) {
            Ok(t) => {
                let set = Arc::new(resource_set(&t.snapshot));
                store.publish(t.snapshot);
                resources.send_replace(set);
                reloads.send_modify(|r| r.applied += 1);
                tracing::info!(path = %path.display(), "topology reloaded");
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "topology edit rejected; still serving the last good state");
                reloads.send_modify(|r| {
                    r.rejected += 1;
                    r.last_error = Some(e.to_string());
                });
            }
        }
    }
}

/// Content digest (cheap for any realistic topology), so edits within one mtime tick count.
fn fingerprint(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &bytes)
            .as_ref()
            .to_vec(),
    )
}
