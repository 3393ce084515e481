//! The topology watcher: file-system events instead of polling, edits in place and by rename,
//! hostile files refused off the runtime with their location while the last good state stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_control::source::{Reloads, TopologyWatch, WatchConfig};
use ferry_core::store::Store;
use ferry_topology::Limits;
use ferry_xds::resources::ResourceSet;
use tokio::sync::watch;

fn example() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/two-clusters.yaml"),
    )
    .unwrap()
}

/// A directory of its own (so no other test's files wake the watcher), removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ferry-source-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Watched {
    store: Arc<Store>,
    reloads: watch::Receiver<Reloads>,
    _resources: watch::Receiver<Arc<ResourceSet>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start(path: &Path, config: WatchConfig) -> Watched {
    let watch = TopologyWatch::new(path.to_path_buf(), config).unwrap();
    let topo = ferry_topology::load_file(path).unwrap();
    let store = Arc::new(Store::new(topo.snapshot));
    let (res_tx, res_rx) = watch::channel(Arc::new(ferry_control::flatten::resource_set(
        &store.load(),
    )));
    let (reload_tx, reloads) = watch::channel(Reloads::default());
    let task = tokio::spawn(watch.run(store.clone(), res_tx, reload_tx));
    Watched {
        store,
        reloads,
        _resources: res_rx,
        task,
    }
}

async fn until(what: &str, rx: &mut watch::Receiver<Reloads>, cond: impl FnMut(&Reloads) -> bool) {
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(cond))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
        .unwrap();
}

/// Writes `text` aside and renames it over `path` (how editors and config managers write): the
/// watcher never reads half of it.
fn replace(path: &Path, text: &str) {
    let aside = path.with_file_name(".topology.yaml.tmp");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

fn has_address(store: &Store, name: &str, ip: &str) -> bool {
    let ip: std::net::IpAddr = ip.parse().unwrap();
    store
        .load()
        .workloads()
        .any(|w| w.name == name && w.addresses == [ip])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_in_place_and_by_rename_are_seen_without_polling() {
    let dir = Dir::new("edits");
    let path = dir.0.join("topology.yaml");
    std::fs::write(&path, example()).unwrap();
    let mut w = start(&path, WatchConfig::default());
    // In place (the watcher may read it half-written and reject that; the whole is applied).
    std::fs::write(
        &path,
        example().replace("address: 198.18.2.20", "address: 198.18.2.21"),
    )
    .unwrap();
    until("the in-place edit", &mut w.reloads, |r| r.applied == 1).await;
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.21"));
    // Written aside and renamed over the file.
    replace(
        &path,
        &example().replace("address: 198.18.2.20", "address: 198.18.2.22"),
    );
    until("the rename", &mut w.reloads, |r| r.applied == 2).await;
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.22"));
    // Replacing the file with the same content, or writing another file, applies nothing.
    replace(
        &path,
        &example().replace("address: 198.18.2.20", "address: 198.18.2.22"),
    );
    std::fs::write(dir.0.join("topology.yaml.unrelated"), "x").unwrap();
    replace(
        &path,
        &example().replace("address: 198.18.2.20", "address: 198.18.2.23"),
    );
    until("the third edit", &mut w.reloads, |r| r.applied >= 3).await;
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.23"));
    assert_eq!(
        w.reloads.borrow().applied,
        3,
        "the unchanged content was not applied again"
    );
}

/// A write that has ended (the file renamed over, or closed by its writer) is read at once: with
/// a debounce of an hour, both edits are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_write_is_read_without_waiting_for_quiet() {
    let dir = Dir::new("ended");
    let path = dir.0.join("topology.yaml");
    std::fs::write(&path, example()).unwrap();
    let config = WatchConfig {
        debounce: Duration::from_secs(3600),
        ..WatchConfig::default()
    };
    let mut w = start(&path, config);
    replace(
        &path,
        &example().replace("address: 198.18.2.20", "address: 198.18.2.21"),
    );
    until("the rename", &mut w.reloads, |r| r.applied == 1).await;
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.21"));
    // In place: opened, truncated, written, closed.
    std::fs::write(
        &path,
        example().replace("address: 198.18.2.20", "address: 198.18.2.22"),
    )
    .unwrap();
    until("the write closed", &mut w.reloads, |r| {
        r.applied == 2 || r.rejected > 0
    })
    .await;
    assert_eq!(w.reloads.borrow().rejected, 0, "read only once written");
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.22"));
    // Truncated and written in place but still open: no write has ended and the directory is
    // not quiet for the hour, so the half-made file is not read; closing it ends the write.
    let mut open = std::fs::File::create(&path).unwrap();
    let text = example().replace("address: 198.18.2.20", "address: 198.18.2.23");
    let (head, tail) = text.split_at(text.len() / 2);
    std::io::Write::write_all(&mut open, head.as_bytes()).unwrap();
    let read = tokio::time::timeout(
        Duration::from_secs(1),
        w.reloads.wait_for(|r| r.applied != 2 || r.rejected != 0),
    )
    .await
    .is_ok();
    assert!(
        !read,
        "a write still open was read: {:?}",
        *w.reloads.borrow()
    );
    std::io::Write::write_all(&mut open, tail.as_bytes()).unwrap();
    drop(open);
    until("the open write closed", &mut w.reloads, |r| {
        r.applied == 3 || r.rejected > 0
    })
    .await;
    assert_eq!(w.reloads.borrow().rejected, 0, "read only once closed");
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.23"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_mib_of_nesting_is_refused_with_its_location_and_the_good_file_restored_is_seen() {
    let dir = Dir::new("nesting");
    let path = dir.0.join("topology.yaml");
    std::fs::write(&path, example()).unwrap();
    let mut w = start(&path, WatchConfig::default());
    let before = w.store.load().workloads().count();
    replace(&path, &format!("clusters: {}", "[".repeat(10 << 20)));
    until("the rejection", &mut w.reloads, |r| r.rejected == 1).await;
    let err = w.reloads.borrow().last_error.clone().unwrap();
    assert!(
        err.contains("topology.yaml:1:74: expected nesting at most 64 deep"),
        "{err}"
    );
    assert_eq!(
        w.store.load().workloads().count(),
        before,
        "the last good state stays"
    );
    replace(
        &path,
        &example().replace("address: 198.18.2.20", "address: 198.18.2.21"),
    );
    until("the good file restored", &mut w.reloads, |r| r.applied == 1).await;
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.21"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parse_over_its_budget_is_rejected_while_the_runtime_keeps_running() {
    let dir = Dir::new("budget");
    let path = dir.0.join("topology.yaml");
    std::fs::write(&path, example()).unwrap();
    // Limits lifted, so the quadratic parse really runs (tens of seconds for 120 KB). The budget
    // is wide enough for the good files on a loaded machine, with a core taken by the parse.
    let config = WatchConfig {
        limits: Limits {
            max_bytes: 64 << 20,
            max_depth: usize::MAX,
        },
        budget: Duration::from_secs(2),
        ..WatchConfig::default()
    };
    let mut w = start(&path, config);
    replace(&path, &format!("clusters: {}", "[".repeat(120_000)));
    // Meanwhile the runtime answers: a timer keeps firing.
    let ticks = tokio::spawn(async {
        let mut n = 0u32;
        let mut every = tokio::time::interval(Duration::from_millis(10));
        loop {
            every.tick().await;
            n += 1;
            if n == 10 {
                return n;
            }
        }
    });
    until("the rejection", &mut w.reloads, |r| r.rejected == 1).await;
    let err = w.reloads.borrow().last_error.clone().unwrap();
    assert!(
        err.contains("expected a parse within 2s, found it still running"),
        "{err}"
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), ticks)
            .await
            .unwrap()
            .unwrap(),
        10
    );
    // A good edit still applies while the abandoned parse runs on.
    replace(
        &path,
        &example().replace("address: 198.18.2.20", "address: 198.18.2.21"),
    );
    until("the good edit", &mut w.reloads, |r| r.applied == 1).await;
    assert!(has_address(&w.store, "echo-east-2", "198.18.2.21"));
}
