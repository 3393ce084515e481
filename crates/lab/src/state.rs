//! What a lab made, written down as it is made, so `down` can undo a partial `up`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Pod {
    pub uid: String,
    pub netns: String,
    pub ip: String,
    pub node: Option<String>,
    pub cluster: String,
    pub enrolled: bool,
    /// Runs `ferry waypoint` (terminates HBONE itself, not captured).
    #[serde(default)]
    pub waypoint: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NodeProc {
    pub pid: u32,
    /// The command line, to restart it.
    pub args: Vec<String>,
    pub netns: String,
    pub mgmt_ip: String,
    pub api: PathBuf,
    pub admin: String,
    pub log: PathBuf,
    pub cluster: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub id: String,
    pub dir: PathBuf,
    /// Every namespace created, in creation order.
    pub netns: Vec<String>,
    /// Every process started.
    pub pids: Vec<u32>,
    pub pods: BTreeMap<String, Pod>,
    pub nodes: BTreeMap<String, NodeProc>,
    /// East-west gateways: name -> namespace.
    #[serde(default)]
    pub gateways: BTreeMap<String, String>,
    pub control_log: PathBuf,
    pub control_addr: String,
    pub topology: PathBuf,
}

impl State {
    /// The pods a benchmark runs between, by name.
    pub fn pod_pair(&self, from: &str, to: &str) -> anyhow::Result<(&Pod, &Pod)> {
        let pod = |name: &str| {
            self.pods
                .get(name)
                .ok_or_else(|| anyhow::anyhow!("no pod {name}"))
        };
        Ok((pod(from)?, pod(to)?))
    }

    /// The node proxy of `node`.
    pub fn node(&self, node: &str) -> anyhow::Result<&NodeProc> {
        self.nodes
            .get(node)
            .ok_or_else(|| anyhow::anyhow!("no node {node}"))
    }

    /// The state of the lab that is up in `dir`.
    pub fn up(dir: &Path) -> anyhow::Result<Self> {
        Self::load(dir).ok_or_else(|| anyhow::anyhow!("no lab is up"))
    }

    pub fn file(dir: &Path) -> PathBuf {
        dir.join("lab.json")
    }

    pub fn load(dir: &Path) -> Option<Self> {
        serde_json::from_str(&std::fs::read_to_string(Self::file(dir)).ok()?).ok()
    }

    pub fn save(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(
            Self::file(&self.dir),
            serde_json::to_string_pretty(self).map_err(std::io::Error::other)?,
        )
    }
}
