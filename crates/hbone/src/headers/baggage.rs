//! The `baggage` header, typed: the source peer metadata a node proxy sends with a CONNECT.
//!
//! W3C baggage (`k=v` members separated by commas, properties after `;` dropped) carrying
//! Istio's keys, plus Ferry's own two. Every key is a const here and nowhere else. Pure and
//! total: any input parses (malformed members are ignored, never fatal: this is metadata), and
//! what [`Baggage::parse`] returns encodes back to itself (the property tests check it).

use http::{HeaderMap, HeaderValue};

use super::BAGGAGE;

/// Istio: the source's cluster.
pub(crate) const CLUSTER: &str = "k8s.cluster.name";
/// Istio: the source's namespace.
pub(crate) const NAMESPACE: &str = "k8s.namespace.name";
/// Istio: the source's canonical service name.
pub(crate) const SERVICE: &str = "service.name";
/// Istio: the source's canonical service revision.
pub(crate) const REVISION: &str = "service.version";
/// Istio: the source's region.
pub(crate) const REGION: &str = "cloud.region";
/// Istio: the source's zone.
pub(crate) const ZONE: &str = "cloud.availability_zone";
/// Ferry: the original source's identity, as the destination's waypoint tells it (`none` for
/// plain TCP from outside the mesh); to be believed only from the destination's own waypoint.
pub(crate) const SOURCE_PRINCIPAL: &str = "ferry.source.principal";
/// Ferry: `true` when the tunnel carries plain TCP from outside the mesh (sent under the
/// destination's identity; to be believed only from that identity).
pub(crate) const PLAINTEXT: &str = "ferry.source.plaintext";

/// At most this many members are read; the rest is ignored.
pub(crate) const MAX_MEMBERS: usize = 64;

/// The kind of workload named by Istio's `k8s.<kind>.name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    Deployment,
    CronJob,
    Job,
    Pod,
}

impl WorkloadKind {
    pub(crate) const ALL: [Self; 4] = [Self::Deployment, Self::CronJob, Self::Job, Self::Pod];

    /// The baggage key naming a workload of this kind.
    pub const fn key(self) -> &'static str {
        match self {
            Self::Deployment => "k8s.deployment.name",
            Self::CronJob => "k8s.cronjob.name",
            Self::Job => "k8s.job.name",
            Self::Pod => "k8s.pod.name",
        }
    }

    fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }
}

/// The source workload's name and kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkloadName {
    pub kind: WorkloadKind,
    pub name: String,
}

/// What the `baggage` header says about a tunnel's source. Every field is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Baggage {
    /// [`CLUSTER`].
    pub cluster: Option<String>,
    /// [`NAMESPACE`].
    pub namespace: Option<String>,
    /// `k8s.<kind>.name` ([`WorkloadKind::key`]); the first one given.
    pub workload: Option<WorkloadName>,
    /// [`SERVICE`].
    pub service: Option<String>,
    /// [`REVISION`].
    pub revision: Option<String>,
    /// [`REGION`].
    pub region: Option<String>,
    /// [`ZONE`].
    pub zone: Option<String>,
    /// [`SOURCE_PRINCIPAL`].
    pub source_principal: Option<String>,
    /// [`PLAINTEXT`] `=true`.
    pub plaintext: bool,
    /// Members with other keys, in the order given (a waypoint passes them on).
    pub other: Vec<(String, String)>,
}

impl Baggage {
    /// Parses a `baggage` header value. Malformed members are ignored; of a key given twice,
    /// the first counts.
    pub fn parse(value: &str) -> Self {
        Self::from_pairs(members(value))
    }

    /// From `k=v` pairs (the untyped `ConnectHeaders::baggage`). Pairs that are not valid
    /// baggage members are ignored; of a key given twice, the first counts.
    pub(crate) fn from_pairs<K, V>(pairs: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut b = Self::default();
        let mut plaintext_seen = false;
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref());
            if !valid_member(k, v) {
                continue;
            }
            let first = |slot: &mut Option<String>| {
                if slot.is_none() {
                    *slot = Some(v.to_string());
                }
            };
            match k {
                CLUSTER => first(&mut b.cluster),
                NAMESPACE => first(&mut b.namespace),
                SERVICE => first(&mut b.service),
                REVISION => first(&mut b.revision),
                REGION => first(&mut b.region),
                ZONE => first(&mut b.zone),
                SOURCE_PRINCIPAL => first(&mut b.source_principal),
                PLAINTEXT if !plaintext_seen => {
                    plaintext_seen = true;
                    b.plaintext = v == "true";
                }
                PLAINTEXT => {}
                _ => match WorkloadKind::from_key(k) {
                    Some(kind) => {
                        if b.workload.is_none() {
                            b.workload = Some(WorkloadName {
                                kind,
                                name: v.to_string(),
                            });
                        }
                    }
                    None => b.other.push((k.to_string(), v.to_string())),
                },
            }
        }
        b
    }

    /// The members, known keys first in a fixed order, then [`Baggage::other`]. Values that
    /// are not valid baggage values are left out.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let known = [
            (CLUSTER, self.cluster.as_deref()),
            (NAMESPACE, self.namespace.as_deref()),
            (
                self.workload.as_ref().map_or("", |w| w.kind.key()),
                self.workload.as_ref().map(|w| w.name.as_str()),
            ),
            (SERVICE, self.service.as_deref()),
            (REVISION, self.revision.as_deref()),
            (REGION, self.region.as_deref()),
            (ZONE, self.zone.as_deref()),
            (SOURCE_PRINCIPAL, self.source_principal.as_deref()),
            (PLAINTEXT, self.plaintext.then_some("true")),
        ];
        known
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain(self.other.iter().cloned())
            .filter(|(k, v)| valid_member(k, v))
            .collect()
    }

    /// The header value: `k=v,k=v`; empty when there is nothing to say.
    pub fn encode(&self) -> String {
        encode_pairs(&self.to_pairs())
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Reads the `baggage` header; absent or malformed, it says nothing.
    pub fn read(map: &HeaderMap) -> Self {
        map.get(BAGGAGE)
            .and_then(|v| v.to_str().ok())
            .map(Self::parse)
            .unwrap_or_default()
    }

    /// Sets the `baggage` header (removes it when there is nothing to say).
    pub fn write(&self, map: &mut HeaderMap) {
        write_pairs(&self.to_pairs(), map);
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Baggage {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self::from_pairs(iter)
    }
}

impl From<&Baggage> for Vec<(String, String)> {
    fn from(b: &Baggage) -> Self {
        b.to_pairs()
    }
}

impl From<Baggage> for Vec<(String, String)> {
    fn from(b: Baggage) -> Self {
        b.to_pairs()
    }
}

/// The valid members of a `baggage` value, at most [`MAX_MEMBERS`], keys and values trimmed.
pub(crate) fn members(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .take(MAX_MEMBERS)
        .filter_map(|member| {
            let kv = member.split(';').next()?;
            let (k, v) = kv.split_once('=')?;
            let (k, v) = (k.trim(), v.trim());
            valid_member(k, v).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// `k=v,k=v` of the valid members.
pub(crate) fn encode_pairs(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .filter(|(k, v)| valid_member(k, v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Sets (or, with no valid member, removes) the `baggage` header.
pub(crate) fn write_pairs(pairs: &[(String, String)], map: &mut HeaderMap) {
    let v = encode_pairs(pairs);
    match HeaderValue::from_str(&v) {
        Ok(v) if !v.is_empty() => {
            map.insert(BAGGAGE, v);
        }
        _ => {
            map.remove(BAGGAGE);
        }
    }
}

/// W3C baggage: the key is an RFC 9110 token; the value is non-empty `baggage-octet`s
/// (visible ASCII but `"` `,` `;` `\`; percent-encoding is the sender's business).
fn valid_member(k: &str, v: &str) -> bool {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let octet = |b: u8| b.is_ascii_graphic() && !b"\",;\\".contains(&b);
    !k.is_empty() && k.bytes().all(token) && !v.is_empty() && v.bytes().all(octet)
}

/// A fuzz target (and the property tests' core): any bytes parse without panicking, and what
/// parses encodes back to itself, through the header value and through a [`HeaderMap`].
/// Panics only if that invariant breaks.
#[cfg(test)]
fn check_round_trip(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let b = Baggage::parse(&text);
    assert_eq!(Baggage::parse(&b.encode()), b, "parse(encode(b)) == b");
    assert_eq!(Baggage::from_pairs(b.to_pairs()), b, "pairs round trip");
    let mut map = HeaderMap::new();
    b.write(&mut map);
    assert_eq!(Baggage::read(&map), b, "header round trip");
    assert_eq!(map.contains_key(BAGGAGE), !b.is_empty());
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn east_pod() -> Baggage {
        Baggage {
            cluster: Some("east".into()),
            namespace: Some("default".into()),
            workload: Some(WorkloadName {
                kind: WorkloadKind::Pod,
                name: "client-0".into(),
            }),
            ..Baggage::default()
        }
    }

    #[test]
    fn what_a_node_proxy_sends_reads_back() {
        let b = east_pod();
        assert_eq!(
            b.encode(),
            "k8s.cluster.name=east,k8s.namespace.name=default,k8s.pod.name=client-0"
        );
        let mut map = HeaderMap::new();
        b.write(&mut map);
        assert_eq!(Baggage::read(&map), b);
    }

    #[test]
    fn istio_keys_and_ferry_keys_are_typed_and_the_rest_kept() {
        let b = Baggage::parse(
            "k8s.cluster.name=c1, k8s.namespace.name=ns,k8s.deployment.name=web,\
             service.name=web,service.version=v2,cloud.region=eu,cloud.availability_zone=eu-1,\
             ferry.source.principal=spiffe://td/ns/a/sa/b,ferry.source.plaintext=true,x.y=z;p=1",
        );
        assert_eq!(
            b,
            Baggage {
                cluster: Some("c1".into()),
                namespace: Some("ns".into()),
                workload: Some(WorkloadName {
                    kind: WorkloadKind::Deployment,
                    name: "web".into()
                }),
                service: Some("web".into()),
                revision: Some("v2".into()),
                region: Some("eu".into()),
                zone: Some("eu-1".into()),
                source_principal: Some("spiffe://td/ns/a/sa/b".into()),
                plaintext: true,
                other: vec![("x.y".into(), "z".into())],
            }
        );
        assert_eq!(Baggage::parse(&b.encode()), b);
    }

    #[test]
    fn malformed_members_are_ignored_and_the_first_of_a_key_counts() {
        let b = Baggage::parse(
            "=,a=,=b,k8s.cluster.name=first,k8s.cluster.name=second,bad key=1,q=\"x\",\
             ferry.source.plaintext=yes,ferry.source.plaintext=true",
        );
        assert_eq!(b.cluster.as_deref(), Some("first"));
        assert!(
            !b.plaintext,
            "only `true` says plaintext, and the first word counts"
        );
        assert!(b.other.is_empty(), "{:?}", b.other);
        assert!(Baggage::parse("").is_empty());
    }

    #[test]
    fn pairs_convert_both_ways() {
        let pairs: Vec<(String, String)> = east_pod().into();
        assert_eq!(
            Baggage::from_pairs(pairs.iter().map(|(k, v)| (k, v))),
            east_pod()
        );
        assert_eq!(pairs.iter().cloned().collect::<Baggage>(), east_pod());
    }

    #[test]
    fn values_that_cannot_be_sent_are_left_out_not_the_whole_header() {
        let b = Baggage {
            cluster: Some("east".into()),
            namespace: Some("has,comma".into()),
            source_principal: Some(String::new()),
            ..Baggage::default()
        };
        assert_eq!(b.encode(), "k8s.cluster.name=east");
        let mut map = HeaderMap::new();
        Baggage::default().write(&mut map);
        assert!(!map.contains_key(BAGGAGE), "nothing to say: no header");
    }

    #[test]
    fn no_more_than_the_member_limit_is_read() {
        let many: Vec<String> = (0..MAX_MEMBERS + 10).map(|i| format!("k{i}=v")).collect();
        assert_eq!(Baggage::parse(&many.join(",")).other.len(), MAX_MEMBERS);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_and_round_trip(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            check_round_trip(&data);
        }

        #[test]
        fn baggage_shaped_text_round_trips(
            members in proptest::collection::vec(
                ("[a-z.]{0,12}|k8s\\.cluster\\.name|k8s\\.pod\\.name|ferry\\.source\\.plaintext",
                 "[ -~]{0,12}|true"),
                0..12,
            ),
            sep in "[,; ]{1,2}",
        ) {
            let text = members
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(&sep);
            check_round_trip(text.as_bytes());
        }

        #[test]
        fn typed_fields_of_valid_values_survive_the_wire(
            cluster in proptest::option::of("[a-z0-9-]{1,20}"),
            namespace in proptest::option::of("[a-z0-9-]{1,20}"),
            pod in proptest::option::of("[a-z0-9-]{1,20}"),
            principal in proptest::option::of("spiffe://[a-z.]{1,10}/ns/[a-z]{1,8}/sa/[a-z]{1,8}"),
            plaintext in any::<bool>(),
        ) {
            let b = Baggage {
                cluster,
                namespace,
                workload: pod.map(|name| WorkloadName { kind: WorkloadKind::Pod, name }),
                source_principal: principal,
                plaintext,
                ..Baggage::default()
            };
            let mut map = HeaderMap::new();
            b.write(&mut map);
            prop_assert_eq!(Baggage::read(&map), b);
        }
    }
}
