//! A lab whose control plane reads Kubernetes (`ferry lab up TOPOLOGY --kubernetes DIR`): the
//! topology file still lays out the namespaces, pods, nodes and gateways, but the control plane
//! is started with `--cluster-id` instead of `--topology` and learns the mesh from each
//! cluster's recorded objects (`DIR/<cluster>.yaml`), served by `ferry lab api-server` in the
//! control plane's namespace, one API server per cluster on its loopback. The first cluster by
//! name is the local one (`--kubeconfig`); every other is a remote cluster, joined by an Istio
//! remote secret (`--remote-secret`). Kubeconfigs and secrets are written 0600 in the state
//! directory.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_core::snapshot::Snapshot;
use serde_json::{Value, json};

use super::Lab;
use crate::api_server::{self, READY};
use crate::procs::{spawn, wait_for_log};
use crate::state::State;

/// The first cluster's API server port on the control plane namespace's loopback; the next
/// clusters take the next ports.
const FIRST_PORT: u16 = 16443;

/// Checks the recorded objects against the lab, starts their API servers in `ctl` and writes
/// the kubeconfigs and remote secrets; the control plane's arguments that read them.
pub(super) fn start(
    lab: &Lab<'_>,
    state: &mut State,
    ctl: &str,
    snap: &Snapshot,
    dir: &Path,
) -> anyhow::Result<Vec<String>> {
    let kube_dir = lab.opts.state_dir.join("kubernetes");
    std::fs::create_dir_all(&kube_dir)?;
    let mut serve = Vec::new();
    let mut clusters = Vec::new();
    for (i, c) in snap.clusters().enumerate() {
        let name = c.name.as_str();
        let objects = dir.join(format!("{name}.yaml"));
        if !objects.is_file() {
            bail!(
                "no recorded objects for cluster {name}: expected {} (a List, as `kubectl get -o yaml` prints it)",
                objects.display()
            );
        }
        let items = api_server::read_objects(&objects)?;
        check_pods(name, &items, snap)
            .with_context(|| format!("{} does not match the lab", objects.display()))?;
        let port = FIRST_PORT + u16::try_from(i)?;
        serve.push("--serve".to_string());
        serve.push(format!("127.0.0.1:{port}={}", objects.display()));
        clusters.push((name.to_string(), port));
    }
    let log = lab.opts.state_dir.join("api-server.log");
    let mut args = vec![lab.exe.clone(), "lab".into(), "api-server".into()];
    args.extend(serve);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn(state, ctl, &argv, &log)?;
    wait_for_log(
        "the recorded objects' API servers",
        Duration::from_secs(20),
        &log,
        READY,
    )?;
    let mut control_args = Vec::new();
    for (i, (name, port)) in clusters.iter().enumerate() {
        let kubeconfig = kubeconfig(name, *port);
        if i == 0 {
            let path = kube_dir.join(format!("{name}.kubeconfig"));
            ferry_tls::secret_file::replace_private(&path, kubeconfig.as_bytes())?;
            control_args.extend([
                "--cluster-id".to_string(),
                name.clone(),
                "--kubeconfig".into(),
                path.display().to_string(),
            ]);
        } else {
            let path = kube_dir.join(format!("{name}.remote-secret.yaml"));
            let secret = serde_yaml_ng::to_string(&remote_secret(name, &kubeconfig))?;
            ferry_tls::secret_file::replace_private(&path, secret.as_bytes())?;
            control_args.extend(["--remote-secret".to_string(), path.display().to_string()]);
        }
    }
    Ok(control_args)
}

/// A kubeconfig for the API server of cluster `name` on the control plane's loopback.
fn kubeconfig(name: &str, port: u16) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": format!("http://127.0.0.1:{port}")}}],
        "users": [{"name": "ferry-lab", "user": {"token": "ferry-lab"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "ferry-lab"}}],
        "current-context": name,
    });
    // A JSON value always serializes as YAML.
    serde_yaml_ng::to_string(&config).unwrap_or_default()
}

/// Cluster `name`'s remote secret, as `istioctl create-remote-secret` writes it.
fn remote_secret(name: &str, kubeconfig: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("istio-remote-secret-{name}"),
            "namespace": "istio-system",
            "labels": {"istio/multiCluster": "true"},
        },
        "stringData": {name: kubeconfig},
    })
}

/// Every recorded Pod of `cluster` must be a workload of the lab in that cluster, with the
/// same namespace, node, service account and address: the lab made its network namespace and
/// the node proxy that serves it from the topology file, and the control plane certifies and
/// routes it from the Pod.
fn check_pods(cluster: &str, items: &[Value], snap: &Snapshot) -> anyhow::Result<()> {
    for pod in items.iter().filter(|i| i["kind"] == "Pod") {
        let text = |v: &Value, default: &str| v.as_str().unwrap_or(default).to_string();
        let name = text(&pod["metadata"]["name"], "");
        let namespace = text(&pod["metadata"]["namespace"], "default");
        let Some(w) = snap
            .workloads()
            .find(|w| w.cluster.as_str() == cluster && w.name == name && w.namespace == namespace)
        else {
            bail!(
                "Pod {namespace}/{name} is no workload of cluster {cluster} in the topology file (the lab has no namespace for it)"
            );
        };
        let node = text(&pod["spec"]["nodeName"], "");
        let lab_node = w.node.as_ref().map_or("", |n| n.as_str());
        if node != lab_node {
            bail!("Pod {namespace}/{name}: spec.nodeName {node:?}, the topology says {lab_node:?}");
        }
        let account = text(&pod["spec"]["serviceAccountName"], "default");
        if account != w.service_account {
            bail!(
                "Pod {namespace}/{name}: spec.serviceAccountName {account:?}, the topology says {:?}",
                w.service_account
            );
        }
        let ip = text(&pod["status"]["podIP"], "");
        if !w.addresses.iter().any(|a| a.to_string() == ip) {
            bail!(
                "Pod {namespace}/{name}: status.podIP {ip:?}, the topology says {:?}",
                w.addresses
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPOLOGY: &str = "
clusters: [{name: east, network: net-east}]
nodes: [{name: east-1, cluster: east}]
workloads:
  - {name: sleep, service_account: sleep, node: east-1, address: 198.18.1.10}
";

    fn pod(node: &str, account: &str, ip: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sleep", "namespace": "default"},
            "spec": {"nodeName": node, "serviceAccountName": account},
            "status": {"podIP": ip},
        })
    }

    #[test]
    fn a_recorded_pod_must_be_the_labs_workload() {
        let snap = ferry_topology::parse("t", TOPOLOGY).unwrap().snapshot;
        check_pods("east", &[pod("east-1", "sleep", "198.18.1.10")], &snap).unwrap();
        for (bad, field) in [
            (pod("east-2", "sleep", "198.18.1.10"), "spec.nodeName"),
            (
                pod("east-1", "echo", "198.18.1.10"),
                "spec.serviceAccountName",
            ),
            (pod("east-1", "sleep", "198.18.1.11"), "status.podIP"),
        ] {
            let e = check_pods("east", &[bad], &snap).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = check_pods("west", &[pod("east-1", "sleep", "198.18.1.10")], &snap)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no workload of cluster west"), "{e}");
    }
}
