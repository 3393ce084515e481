//! The CNI contract as a plugin sees it (CNI spec 1.0, `SPEC.md` of containernetworking/cni):
//! the command and its parameters in environment variables, the network configuration on
//! stdin, a result or an error on stdout. Pure: parsing and rendering only, no I/O.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The versions of the spec this plugin speaks (CHECK needs 0.4.0 or later).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.4.0", "1.0.0", "1.1.0"];

/// Where the node agent listens for this plugin when the configuration does not say.
pub const DEFAULT_AGENT_SOCKET: &str = "/var/run/ferry/cni.sock";

/// What the runtime asks (`CNI_COMMAND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
}

/// The parameters of one invocation, from its environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    pub container_id: String,
    /// The container's network namespace: a path (`/var/run/netns/x`, `/proc/<pid>/ns/net`).
    /// DEL may come without one (the namespace is gone).
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub pod: PodRef,
}

/// The pod a Kubernetes runtime names in `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
/// `K8S_POD_UID`); empty outside Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The network configuration on stdin, as the runtime hands it to one plugin of a list.
#[derive(Clone, Debug, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The result of the plugins before this one in the list: passed on unchanged.
    #[serde(rename = "prevResult")]
    pub prev_result: Option<Value>,
    /// Where the node agent listens (Ferry's key).
    #[serde(default = "default_agent_socket")]
    pub agent_socket: PathBuf,
}

fn default_agent_socket() -> PathBuf {
    PathBuf::from(DEFAULT_AGENT_SOCKET)
}

/// A CNI error: its code (the spec's well-known ones below 100), message and details; written
/// to stdout as the spec's error object, and the plugin exits non-zero.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    pub code: u32,
    pub msg: &'static str,
    pub details: String,
}

/// The spec's well-known error codes.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const CONTAINER_UNKNOWN: u32 = 3;
    pub const INVALID_ENVIRONMENT: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// Ferry's own: the pod's capture is not what it must be.
    pub const CAPTURE_MISSING: u32 = 100;
    /// Ferry's own: the node agent or the node proxy refused or failed the pod.
    pub const NOT_ENROLLED: u32 = 101;
}

// === impl CniError ===

impl CniError {
    pub fn new(code: u32, msg: &'static str, details: impl Into<String>) -> Self {
        Self {
            code,
            msg,
            details: details.into(),
        }
    }

    /// The spec's error object, in the configuration's version (or the newest one we speak).
    pub fn to_json(&self, cni_version: Option<&str>) -> Value {
        serde_json::json!({
            "cniVersion": cni_version.unwrap_or(SUPPORTED_VERSIONS[SUPPORTED_VERSIONS.len() - 1]),
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

// === impl Command ===

impl Command {
    fn parse(s: &str) -> Result<Self, CniError> {
        match s {
            "ADD" => Ok(Self::Add),
            "DEL" => Ok(Self::Del),
            "CHECK" => Ok(Self::Check),
            "VERSION" => Ok(Self::Version),
            other => Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                "unknown CNI_COMMAND",
                format!("{other:?}; this plugin knows ADD, DEL, CHECK and VERSION"),
            )),
        }
    }
}

// === impl Invocation ===

impl Invocation {
    /// From the environment `var` reads (`std::env::var` in the plugin).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, CniError> {
        let required = |name: &'static str| {
            var(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                CniError::new(
                    code::INVALID_ENVIRONMENT,
                    "missing environment variable",
                    name,
                )
            })
        };
        let command = Command::parse(&required("CNI_COMMAND")?)?;
        if command == Command::Version {
            return Ok(Self {
                command,
                container_id: String::new(),
                netns: None,
                ifname: String::new(),
                pod: PodRef::default(),
            });
        }
        let netns = var("CNI_NETNS")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        if netns.is_none() && command != Command::Del {
            return Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                "missing environment variable",
                "CNI_NETNS",
            ));
        }
        Ok(Self {
            command,
            container_id: required("CNI_CONTAINERID")?,
            netns,
            ifname: required("CNI_IFNAME")?,
            pod: parse_args(&var("CNI_ARGS").unwrap_or_default())?,
        })
    }
}

/// `CNI_ARGS`: `KEY=VALUE` pairs separated by `;`. Keys other than the pod's are ignored (the
/// runtime passes `IgnoreUnknown` and its own).
pub fn parse_args(args: &str) -> Result<PodRef, CniError> {
    let mut pod = PodRef::default();
    for pair in args.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            CniError::new(
                code::INVALID_ENVIRONMENT,
                "CNI_ARGS is not KEY=VALUE pairs",
                format!("{pair:?}"),
            )
        })?;
        match k {
            "K8S_POD_NAMESPACE" => pod.namespace = v.to_string(),
            "K8S_POD_NAME" => pod.name = v.to_string(),
            "K8S_POD_UID" => pod.uid = v.to_string(),
            _ => {}
        }
    }
    Ok(pod)
}

/// The configuration on stdin, checked: its version is one we speak.
pub fn parse_conf(stdin: &[u8]) -> Result<NetConf, CniError> {
    let conf: NetConf = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODE_FAILURE,
            "the network configuration is not valid JSON for this plugin",
            e.to_string(),
        )
    })?;
    if !SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "incompatible CNI version",
            format!(
                "{}; this plugin speaks {}",
                conf.cni_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    Ok(conf)
}

/// What VERSION answers.
pub fn version_json(cni_version: Option<&str>) -> Value {
    serde_json::json!({
        "cniVersion": cni_version.unwrap_or(SUPPORTED_VERSIONS[SUPPORTED_VERSIONS.len() - 1]),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

/// What ADD answers: the previous plugins' result, unchanged but for its version (a chained
/// plugin that adds no interface passes the result on).
pub fn add_result(conf: &NetConf) -> Result<Value, CniError> {
    let mut result = conf.prev_result.clone().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "ferry-cni must be chained after a plugin that sets up the interface",
            "no prevResult in the configuration",
        )
    })?;
    if let Some(o) = result.as_object_mut() {
        o.insert("cniVersion".into(), Value::String(conf.cni_version.clone()));
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn an_add_names_the_pod_from_cni_args_and_ignores_other_keys() {
        let inv = Invocation::from_env(env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/var/run/netns/p"),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u-1",
            ),
        ]))
        .unwrap();
        assert_eq!(inv.command, Command::Add);
        assert_eq!(inv.netns, Some(PathBuf::from("/var/run/netns/p")));
        assert_eq!(
            inv.pod,
            PodRef {
                namespace: "shop".into(),
                name: "web-1".into(),
                uid: "u-1".into()
            }
        );
    }

    #[test]
    fn bad_environments_are_named() {
        let e = Invocation::from_env(env(&[("CNI_COMMAND", "ADD")])).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert_eq!(e.details, "CNI_NETNS");
        let e = Invocation::from_env(env(&[("CNI_COMMAND", "FROB")])).unwrap_err();
        assert!(e.details.contains("FROB"), "{e}");
        let e = parse_args("K8S_POD_NAME").unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        // DEL may come without the namespace: it may be gone already.
        let del = Invocation::from_env(env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ]))
        .unwrap();
        assert_eq!(del.netns, None);
    }

    #[test]
    fn add_passes_the_previous_result_on_and_refuses_to_run_unchained() {
        let conf = parse_conf(
            br#"{"cniVersion":"1.0.0","name":"k8s","type":"ferry-cni",
                 "prevResult":{"cniVersion":"1.0.0","ips":[{"address":"198.18.60.10/24"}]}}"#,
        )
        .unwrap();
        assert_eq!(conf.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        let r = add_result(&conf).unwrap();
        assert_eq!(r["ips"][0]["address"], "198.18.60.10/24");
        assert_eq!(r["cniVersion"], "1.0.0");
        let alone = parse_conf(br#"{"cniVersion":"1.0.0","type":"ferry-cni"}"#).unwrap();
        assert_eq!(add_result(&alone).unwrap_err().code, code::INVALID_CONFIG);
    }

    #[test]
    fn configurations_of_other_versions_or_not_json_are_refused() {
        let e = parse_conf(br#"{"cniVersion":"0.2.0"}"#).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        let e = parse_conf(b"{").unwrap_err();
        assert_eq!(e.code, code::DECODE_FAILURE);
        let j = e.to_json(None);
        assert_eq!(j["code"], 6);
        assert_eq!(version_json(None)["supportedVersions"][1], "1.0.0");
    }
}
