//! The plugin's questions to the node agent and its answers: one JSON object per line on the
//! agent's Unix stream socket, one question per connection.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::spec::PodRef;

/// The largest question the agent reads (a pod's names and a path are far smaller).
pub const MAX_LINE: usize = 16 * 1024;

/// What the plugin asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Ask {
    /// A pod started: enroll it if its namespace is enrolled. Answered once the node proxy has
    /// taken it (capture in place), or with an error.
    Add {
        pod: PodRef,
        container_id: String,
        netns: PathBuf,
        /// Inbound ports of the pod left out of its capture (ZDS's Ferry extension): a setting
        /// of the node's enroller (`ferry lab`, for its benchmarks' direct baseline), which the
        /// plugin never sends; the socket is root's only.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        uncaptured: Vec<u16>,
    },
    /// A pod ended: release it (known or not).
    Del { pod: PodRef, container_id: String },
    /// Is the pod enrolled, and is a node proxy serving the agent's pods?
    Check { pod: PodRef, container_id: String },
}

/// The agent's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// Empty when the question was answered; else what failed.
    #[serde(default)]
    pub error: String,
    /// The pod is the agent's (its namespace is enrolled and the node proxy took it).
    #[serde(default)]
    pub enrolled: bool,
    /// A node proxy is connected and acknowledged the agent's last replay.
    #[serde(default)]
    pub served: bool,
}

impl Answer {
    pub fn failed(error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_round_trip_as_tagged_json() {
        let ask = Ask::Add {
            pod: PodRef {
                namespace: "shop".into(),
                name: "web".into(),
                uid: String::new(),
            },
            container_id: "c1".into(),
            netns: "/var/run/netns/web".into(),
            uncaptured: Vec::new(),
        };
        let line = serde_json::to_string(&ask).unwrap();
        assert!(line.starts_with(r#"{"op":"add""#), "{line}");
        assert_eq!(serde_json::from_str::<Ask>(&line).unwrap(), ask);
        assert!(serde_json::from_str::<Ask>(r#"{"op":"frob"}"#).is_err());
        assert!(
            !line.contains("uncaptured"),
            "the plugin's add sends none: {line}"
        );
        let lab = Ask::Add {
            pod: PodRef::default(),
            container_id: "c".into(),
            netns: "/n".into(),
            uncaptured: vec![18080],
        };
        let line = serde_json::to_string(&lab).unwrap();
        assert!(line.contains(r#""uncaptured":[18080]"#), "{line}");
        assert_eq!(serde_json::from_str::<Ask>(&line).unwrap(), lab);
    }
}
