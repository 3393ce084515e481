//! What a lab made, written down as it is made, so `down` can undo a partial `up`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Pod {
    pub(crate) uid: String,
    /// Its workload's namespace (as its node agent is told).
    #[serde(default)]
    pub(crate) namespace: String,
    pub(crate) netns: String,
    pub(crate) ip: String,
    pub(crate) node: Option<String>,
    pub(crate) cluster: String,
    pub(crate) enrolled: bool,
    /// Runs `ferry waypoint` (terminates HBONE itself, not captured).
    #[serde(default)]
    pub(crate) waypoint: bool,
    /// The command line its echo app was started with (`<exe> lab echo --name <pod> ...`), to
    /// start it again.
    #[serde(default)]
    pub(crate) app: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct NodeProc {
    pub(crate) pid: u32,
    /// The command line, to restart it.
    pub(crate) args: Vec<String>,
    pub(crate) netns: String,
    pub(crate) mgmt_ip: String,
    /// Its node agent's socket, where the lab enrolls the node's pods ([`crate::agent`]).
    #[serde(default)]
    pub(crate) agent: PathBuf,
    pub(crate) admin: String,
    pub(crate) log: PathBuf,
    pub(crate) cluster: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct State {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    /// Every namespace created, in creation order.
    pub(crate) netns: Vec<String>,
    /// Every process started.
    pub(crate) pids: Vec<u32>,
    pub(crate) pods: BTreeMap<String, Pod>,
    pub(crate) nodes: BTreeMap<String, NodeProc>,
    /// East-west gateways: name -> namespace.
    #[serde(default)]
    pub(crate) gateways: BTreeMap<String, String>,
    /// East-west gateways: name -> admin address (on the management network).
    #[serde(default)]
    pub(crate) gateway_admins: BTreeMap<String, String>,
    pub(crate) control_log: PathBuf,
    pub(crate) control_addr: String,
    pub(crate) topology: PathBuf,
}

impl State {
    /// The pods a benchmark runs between, by name.
    pub(crate) fn pod_pair(&self, from: &str, to: &str) -> anyhow::Result<(&Pod, &Pod)> {
        let pod = |name: &str| {
            self.pods
                .get(name)
                .ok_or_else(|| anyhow::anyhow!("no pod {name}"))
        };
        Ok((pod(from)?, pod(to)?))
    }

    /// The node proxy of `node`.
    pub(crate) fn node(&self, node: &str) -> anyhow::Result<&NodeProc> {
        self.nodes
            .get(node)
            .ok_or_else(|| anyhow::anyhow!("no node {node}"))
    }

    /// The state of the lab that is up in `dir`.
    pub(crate) fn up(dir: &Path) -> anyhow::Result<Self> {
        Self::load(dir).ok_or_else(|| anyhow::anyhow!("no lab is up"))
    }

    pub(crate) fn file(dir: &Path) -> PathBuf {
        dir.join("lab.json")
    }

    pub(crate) fn load(dir: &Path) -> Option<Self> {
        serde_json::from_str(&std::fs::read_to_string(Self::file(dir)).ok()?).ok()
    }

    /// Writes the state aside and renames it over the old, so that a `ferry lab` command
    /// reading it meanwhile (a `lab exec` during a handover) sees the old state or the new,
    /// never an empty file.
    pub(crate) fn save(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let file = Self::file(&self.dir);
        let aside = file.with_extension(format!("json.{}", std::process::id()));
        std::fs::write(
            &aside,
            serde_json::to_string_pretty(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&aside, &file)
    }
}
