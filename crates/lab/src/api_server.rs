//! `ferry lab api-server` (inside the lab): recorded Kubernetes objects served over the API's
//! list/watch protocol, one API server per cluster, for a lab whose control plane reads
//! Kubernetes (`ferry lab up --kubernetes DIR`). It is `ferry_k8s::testing::ApiServer`, the
//! stand-in the Kubernetes source's tests run against (no real API server runs on these
//! machines): real HTTP, lists with resourceVersions, watches, server-side apply of the
//! `ServiceImport`s and `ServiceExport` status the control plane writes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_json::Value;

/// What `up` waits for in the server's log once every cluster's server listens.
pub(crate) const READY: &str = "ferry lab api-server: serving";

/// One cluster's server: where it listens and the file of its objects.
#[derive(Debug, Clone)]
struct Served {
    listen: SocketAddr,
    objects: PathBuf,
}

/// `ADDR=FILE`, as `--serve` takes it.
fn parse_served(arg: &str) -> anyhow::Result<Served> {
    let (listen, objects) = arg
        .split_once('=')
        .with_context(|| format!("--serve: expected ADDR=FILE, found {arg:?}"))?;
    let listen = listen
        .parse()
        .with_context(|| format!("--serve: {listen:?} is not an address (IP:PORT)"))?;
    Ok(Served {
        listen,
        objects: objects.into(),
    })
}

/// The objects of a recorded file: a `List` as `kubectl get -o yaml` prints it (several
/// documents are read one after another), each item with an `apiVersion`, a `kind` and a
/// `metadata.name`; an error names the file and the item that is wrong.
pub(crate) fn read_objects(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut items = Vec::new();
    for (d, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        let list: Value = serde::Deserialize::deserialize(doc)
            .with_context(|| format!("{}: document {d} is not YAML", path.display()))?;
        if list.is_null() {
            continue;
        }
        let Some(list_items) = list["items"].as_array() else {
            bail!(
                "{}: document {d}: expected a List with items (kubectl get -o yaml), found kind {}",
                path.display(),
                list["kind"]
            );
        };
        for (i, item) in list_items.iter().enumerate() {
            let has = |field: &Value| field.as_str().is_some_and(|s| !s.is_empty());
            if !has(&item["apiVersion"]) || !has(&item["kind"]) || !has(&item["metadata"]["name"]) {
                bail!(
                    "{}: document {d}, item {i}: expected apiVersion, kind and metadata.name",
                    path.display()
                );
            }
            items.push(item.clone());
        }
    }
    Ok(items)
}

/// Serves each file's objects at its address until the process is stopped.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    if args.is_empty() {
        bail!("nothing to serve: give --serve ADDR=FILE");
    }
    let mut clusters = Vec::new();
    for arg in args {
        let s = parse_served(arg)?;
        let items = read_objects(&s.objects)?;
        clusters.push((s, items));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut servers = Vec::new();
        for (s, items) in clusters {
            let listener = tokio::net::TcpListener::bind(s.listen)
                .await
                .with_context(|| format!("listening on {}", s.listen))?;
            let n = items.len();
            let server = ferry_k8s::testing::ApiServer::serve(listener, items)?;
            println!(
                "serving {n} objects of {} on http://{}",
                s.objects.display(),
                server.addr
            );
            servers.push(server);
        }
        println!("{READY}");
        std::future::pending::<anyhow::Result<()>>().await
    })
}
