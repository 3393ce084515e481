//! A verified token's pod binding, and the node it lets the caller act for (pure).

use ferry_core::model::{ClusterId, NodeName};
use ferry_core::snapshot::Snapshot;
use serde::Deserialize;

use crate::ca::authz::GATEWAY_PREFIX;
use crate::ca::k8s::config::ServiceAccount;

/// Why a Kubernetes service-account token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error("the service-account token is malformed: {0}")]
    Malformed(String),
    #[error("the service-account token is signed with {0}; only RS256 and ES256 are accepted")]
    Algorithm(String),
    #[error("the service-account token's issuer {issuer:?} is unknown (known issuers: {known})")]
    UnknownIssuer { issuer: String, known: String },
    #[error(
        "the service-account token's signature does not verify with the keys of cluster {clusters}"
    )]
    BadSignature { clusters: String },
    #[error("no key {kid:?} among the signing keys of cluster {cluster}")]
    UnknownKey { kid: String, cluster: ClusterId },
    #[error("the signing keys of cluster {cluster} could not be read: {reason}")]
    Keys { cluster: ClusterId, reason: String },
    #[error("the service-account token expired (exp {exp})")]
    Expired { exp: u64 },
    #[error("the service-account token is not valid yet (nbf {nbf})")]
    NotYetValid { nbf: u64 },
    #[error("the service-account token is for audience {got:?}, not one of {want:?}")]
    WrongAudience { got: Vec<String>, want: Vec<String> },
    #[error("the service-account token was issued by cluster {issued_by}, but {claimed}")]
    AnotherCluster {
        issued_by: ClusterId,
        claimed: String,
    },
    #[error(
        "the service-account token is not bound to a pod (no `kubernetes.io.pod` claim): use a projected token"
    )]
    NoPodBinding,
    #[error(
        "service account {account} is not a node proxy's (node-proxy accounts: {trusted}); only those act for a node"
    )]
    NotNodeProxy { account: String, trusted: String },
    #[error("the token is bound to node {node}, which is not part of the mesh")]
    UnknownNode { node: NodeName },
    #[error(
        "the token names no node and pod {pod} is not in cluster {cluster}'s topology, so its node is unknown"
    )]
    UnknownPod { pod: String, cluster: ClusterId },
    #[error(
        "the token is bound to pod {pod} uid {token_uid}, but the topology's pod has uid {topology_uid}"
    )]
    PodUid {
        pod: String,
        token_uid: String,
        topology_uid: String,
    },
    #[error("pod {pod} runs on no node in the topology")]
    PodWithoutNode { pod: String },
}

/// The claims of a Kubernetes service-account token that Ferry reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Claims {
    #[serde(default)]
    pub iss: Option<String>,
    #[serde(default, deserialize_with = "one_or_many")]
    pub aud: Vec<String>,
    #[serde(default)]
    pub exp: Option<u64>,
    #[serde(default)]
    pub nbf: Option<u64>,
    #[serde(default, rename = "kubernetes.io")]
    pub kubernetes: Option<KubernetesClaim>,
}

/// The `kubernetes.io` claim: what the token is bound to.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct KubernetesClaim {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub pod: Option<Named>,
    #[serde(default)]
    pub serviceaccount: Option<Named>,
    /// Kubernetes 1.30+ binds the node the pod is scheduled on.
    #[serde(default)]
    pub node: Option<Named>,
}

/// An object reference in the binding.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Named {
    pub name: String,
    #[serde(default)]
    pub uid: String,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// The node a verified token of `cluster` acts for.
///
/// `claimed` is the caller's own word for its cluster (the `clusterid` metadata Istio's node
/// proxy sends); it must agree with the issuer. The binding must be a pod of a node-proxy
/// account; its node is the token's `node` claim, else the pod's node in `snap` (found by
/// namespace and name in `cluster`, and by uid where the topology's uid is a Kubernetes one).
/// Anything unknown is refused.
pub fn bound_node(
    snap: &Snapshot,
    cluster: &ClusterId,
    claims: &Claims,
    claimed: Option<&str>,
    node_proxies: &[ServiceAccount],
) -> Result<NodeName, Denial> {
    if let Some(c) = claimed.filter(|c| !c.is_empty() && *c != cluster.as_str()) {
        return Err(Denial::AnotherCluster {
            issued_by: cluster.clone(),
            claimed: format!("the caller says it is in cluster {c}"),
        });
    }
    let k8s = claims.kubernetes.as_ref().ok_or(Denial::NoPodBinding)?;
    let pod = k8s.pod.as_ref().ok_or(Denial::NoPodBinding)?;
    let account = ServiceAccount {
        namespace: k8s.namespace.clone(),
        name: k8s
            .serviceaccount
            .as_ref()
            .map(|s| s.name.clone())
            .unwrap_or_default(),
    };
    if !node_proxies.contains(&account) {
        return Err(Denial::NotNodeProxy {
            account: account.to_string(),
            trusted: node_proxies
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let pod_name = format!("{}/{}", k8s.namespace, pod.name);
    let node = match &k8s.node {
        Some(n) => NodeName::new(n.name.clone()),
        None => pod_node(snap, cluster, &k8s.namespace, pod, &pod_name)?,
    };
    // A Kubernetes node may be named `gateway.x`; it never acts as an east-west gateway.
    if node.as_str().starts_with(GATEWAY_PREFIX) {
        return Err(Denial::UnknownNode { node });
    }
    match snap.node(&node) {
        None => Err(Denial::UnknownNode { node }),
        Some(n) if &n.cluster != cluster => Err(Denial::AnotherCluster {
            issued_by: cluster.clone(),
            claimed: format!("its node {node} is in cluster {}", n.cluster),
        }),
        Some(_) => Ok(node),
    }
}

/// The node of pod `namespace/name` of `cluster` in the topology.
fn pod_node(
    snap: &Snapshot,
    cluster: &ClusterId,
    namespace: &str,
    pod: &Named,
    pod_name: &str,
) -> Result<NodeName, Denial> {
    let same_name: Vec<_> = snap
        .workloads()
        .filter(|w| w.namespace == namespace && w.name == pod.name)
        .collect();
    let Some(w) = same_name.iter().find(|w| &w.cluster == cluster) else {
        return Err(match same_name.first() {
            Some(w) => Denial::AnotherCluster {
                issued_by: cluster.clone(),
                claimed: format!("pod {pod_name} is in cluster {}", w.cluster),
            },
            None => Denial::UnknownPod {
                pod: pod_name.to_string(),
                cluster: cluster.clone(),
            },
        });
    };
    if is_kubernetes_uid(w.uid.as_str()) && w.uid.as_str() != pod.uid {
        return Err(Denial::PodUid {
            pod: pod_name.to_string(),
            token_uid: pod.uid.clone(),
            topology_uid: w.uid.to_string(),
        });
    }
    w.node.clone().ok_or_else(|| Denial::PodWithoutNode {
        pod: pod_name.to_string(),
    })
}

/// A Kubernetes object uid: a UUID, `8-4-4-4-12` hex digits.
fn is_kubernetes_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use ferry_core::testing::MeshBuilder;

    use super::*;

    fn ztunnel() -> Vec<ServiceAccount> {
        vec!["istio-system/ztunnel".parse().unwrap()]
    }

    fn claims(pod: &str, node: Option<&str>) -> Claims {
        Claims {
            kubernetes: Some(KubernetesClaim {
                namespace: "istio-system".into(),
                pod: Some(Named {
                    name: pod.into(),
                    uid: "u-1".into(),
                }),
                serviceaccount: Some(Named {
                    name: "ztunnel".into(),
                    uid: String::new(),
                }),
                node: node.map(|n| Named {
                    name: n.into(),
                    uid: String::new(),
                }),
            }),
            ..Claims::default()
        }
    }

    fn snap() -> Snapshot {
        let mut m = MeshBuilder::new();
        m.cluster("east", "net").cluster("west", "net");
        m.node("n1", "east", "r/z/s").node("w1", "west", "r/z/s");
        m.pod("a", "n1", "198.18.1.1");
        m.build()
    }

    #[test]
    fn the_node_comes_from_the_node_claim_or_else_the_topology() {
        let s = snap();
        let east = ClusterId::new("east");
        assert_eq!(
            bound_node(
                &s,
                &east,
                &claims("zt-1", Some("n1")),
                Some("east"),
                &ztunnel()
            ),
            Ok(NodeName::new("n1"))
        );
        // No node claim, and the pod is not in the topology: fail closed.
        assert!(matches!(
            bound_node(&s, &east, &claims("zt-1", None), None, &ztunnel()),
            Err(Denial::UnknownPod { .. })
        ));
        // A node of another cluster, or a caller that says it is elsewhere.
        assert!(matches!(
            bound_node(&s, &east, &claims("zt-1", Some("w1")), None, &ztunnel()),
            Err(Denial::AnotherCluster { .. })
        ));
        assert!(matches!(
            bound_node(
                &s,
                &east,
                &claims("zt-1", Some("n1")),
                Some("west"),
                &ztunnel()
            ),
            Err(Denial::AnotherCluster { .. })
        ));
        assert!(matches!(
            bound_node(&s, &east, &claims("zt-1", Some("gone")), None, &ztunnel()),
            Err(Denial::UnknownNode { .. })
        ));
        assert!(matches!(
            bound_node(
                &s,
                &east,
                &claims("zt-1", Some("gateway.gw")),
                None,
                &ztunnel()
            ),
            Err(Denial::UnknownNode { .. })
        ));
        // Not a node proxy's account; no pod binding.
        assert!(matches!(
            bound_node(&s, &east, &claims("zt-1", Some("n1")), None, &[]),
            Err(Denial::NotNodeProxy { .. })
        ));
        assert_eq!(
            bound_node(&s, &east, &Claims::default(), None, &ztunnel()),
            Err(Denial::NoPodBinding)
        );
    }

    #[test]
    fn a_pod_in_the_topology_gives_its_node_and_a_kubernetes_uid_must_match() {
        let mut m = MeshBuilder::new();
        m.cluster("east", "net").node("n1", "east", "r/z/s");
        let uid = "0f8fad5b-d9cb-469f-a165-70867728950e";
        m.pod("zt", "n1", "198.18.1.2");
        let s = m.build();
        let accounts = vec!["default/default".parse().unwrap()];
        let mut c = claims("zt", None);
        if let Some(k) = c.kubernetes.as_mut() {
            k.namespace = "default".into();
            k.serviceaccount = Some(Named {
                name: "default".into(),
                uid: String::new(),
            });
        }
        let east = ClusterId::new("east");
        assert_eq!(
            bound_node(&s, &east, &c, None, &accounts),
            Ok(NodeName::new("n1"))
        );
        // The same pod with a Kubernetes uid in the topology: the token's must match.
        m.workload_mut("zt").uid = ferry_core::model::WorkloadUid::new(uid);
        let s = m.build();
        assert!(matches!(
            bound_node(&s, &east, &c, None, &accounts),
            Err(Denial::PodUid { .. })
        ));
        assert!(is_kubernetes_uid(uid));
        assert!(!is_kubernetes_uid("east//v1/Pod/default/zt"));
    }
}
