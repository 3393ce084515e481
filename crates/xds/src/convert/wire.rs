//! `istio.workload.Address` as the decoder reads it: `ferry_api`'s message with the three fields
//! that many workloads repeat (the service map, the labels, the locality) left as their wire
//! bytes. The interner finds the copy it holds of such a field by those bytes
//! ([`super::Interner::services_wire`] and the like) and decodes them only the first time, so
//! the replicas of a deployment cost no map built, hashed, compared and dropped each.
//!
//! Every other field is `ferry_api`'s, with its number and type: a message decodes here exactly
//! when it decodes there. The fields left as bytes are decoded as `ferry_api` does the first
//! time they are seen (the same bytes again decode the same); when they do not decode, the
//! caller takes the error `ferry_api`'s decoding gives ([`not_an_address`]).

use std::collections::BTreeMap;

use ferry_api::workload as wl;
use prost::Message;

/// One resource of type `istio.workload.Address`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Address {
    #[prost(oneof = "AddressType", tags = "1, 2")]
    pub r#type: Option<AddressType>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum AddressType {
    #[prost(message, tag = "1")]
    Workload(Workload),
    #[prost(message, tag = "2")]
    Service(wl::Service),
}

/// `istio.workload.Workload`, field for field (`workload.proto`), but `services`,
/// `ferry_labels` (each entry's bytes) and `locality` (each occurrence's bytes).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Workload {
    #[prost(string, tag = "20")]
    pub uid: String,
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub addresses: Vec<Vec<u8>>,
    #[prost(string, tag = "21")]
    pub hostname: String,
    #[prost(string, tag = "4")]
    pub network: String,
    #[prost(int32, tag = "5")]
    pub tunnel_protocol: i32,
    #[prost(string, tag = "6")]
    pub trust_domain: String,
    #[prost(string, tag = "7")]
    pub service_account: String,
    #[prost(message, optional, tag = "8")]
    pub waypoint: Option<wl::GatewayAddress>,
    #[prost(message, optional, tag = "19")]
    pub network_gateway: Option<wl::GatewayAddress>,
    #[prost(string, tag = "9")]
    pub node: String,
    #[prost(string, tag = "10")]
    pub canonical_name: String,
    #[prost(string, tag = "11")]
    pub canonical_revision: String,
    #[prost(int32, tag = "12")]
    pub workload_type: i32,
    #[prost(string, tag = "13")]
    pub workload_name: String,
    #[prost(bool, tag = "14")]
    pub native_tunnel: bool,
    #[prost(message, optional, tag = "23")]
    pub application_tunnel: Option<wl::ApplicationTunnel>,
    /// `map<string, PortList>`: each entry's bytes.
    #[prost(bytes = "vec", repeated, tag = "22")]
    pub services: Vec<Vec<u8>>,
    #[prost(string, repeated, tag = "16")]
    pub authorization_policies: Vec<String>,
    #[prost(int32, tag = "17")]
    pub status: i32,
    #[prost(string, tag = "18")]
    pub cluster_id: String,
    /// `Locality`: each occurrence's bytes (a message sent twice is merged).
    #[prost(bytes = "vec", repeated, tag = "24")]
    pub locality: Vec<Vec<u8>>,
    #[prost(int32, tag = "25")]
    pub network_mode: i32,
    #[prost(message, repeated, tag = "26")]
    pub extensions: Vec<wl::Extension>,
    #[prost(message, optional, tag = "27")]
    pub capacity: Option<u32>,
    #[prost(bool, tag = "10000")]
    pub ferry_eastwest_gateway: bool,
    /// `map<string, string>`: each entry's bytes.
    #[prost(bytes = "vec", repeated, tag = "10001")]
    pub ferry_labels: Vec<Vec<u8>>,
    #[prost(bool, tag = "10002")]
    pub ferry_terminating: bool,
    #[prost(bool, tag = "10003")]
    pub ferry_dns_capture: bool,
}

/// One entry of `map<string, PortList>`, as protobuf encodes a map.
#[derive(Clone, PartialEq, prost::Message)]
struct ServiceEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<wl::PortList>,
}

/// One entry of `map<string, string>`.
#[derive(Clone, PartialEq, prost::Message)]
struct LabelEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// The service map these entries encode, as `ferry_api` decodes it (a key sent twice keeps
/// its last value).
pub(super) fn services(
    entries: &[Vec<u8>],
) -> Result<BTreeMap<String, wl::PortList>, prost::DecodeError> {
    let mut map = BTreeMap::new();
    for e in entries {
        let e = ServiceEntry::decode(e.as_slice())?;
        map.insert(e.key, e.value.unwrap_or_default());
    }
    Ok(map)
}

/// The labels these entries encode, as `ferry_api` decodes them.
pub(super) fn labels(entries: &[Vec<u8>]) -> Result<BTreeMap<String, String>, prost::DecodeError> {
    let mut map = BTreeMap::new();
    for e in entries {
        let e = LabelEntry::decode(e.as_slice())?;
        map.insert(e.key, e.value);
    }
    Ok(map)
}

/// The locality these occurrences encode, merged as `ferry_api` merges them; `None` when the
/// field was not sent.
pub(super) fn locality(sent: &[Vec<u8>]) -> Result<Option<wl::Locality>, prost::DecodeError> {
    if sent.is_empty() {
        return Ok(None);
    }
    let mut l = wl::Locality::default();
    for bytes in sent {
        l.merge(bytes.as_slice())?;
    }
    Ok(Some(l))
}

/// What the client says of a resource that does not decode: `ferry_api`'s error for it (the
/// one the whole message decoded at once gives), else `e`.
pub(super) fn not_an_address(bytes: &[u8], e: prost::DecodeError) -> String {
    let e = wl::Address::decode(bytes).err().unwrap_or(e);
    format!("not an istio.workload.Address: {e}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ferry_api::workload as wl;
    use prost::Message;

    /// Every field of `ferry_api`'s Workload is one of ours: a workload with each field set
    /// decodes here with nothing left over (prost skips a field it does not know, which would
    /// shorten the encoding). Written without `..Default::default()`, so a field added to
    /// `workload.proto` fails this test's build until it is added here and to [`super::Workload`].
    #[test]
    fn every_field_of_ferry_api_s_workload_is_read() {
        let full = wl::Workload {
            uid: "uid".into(),
            name: "name".into(),
            namespace: "ns".into(),
            addresses: vec![vec![198, 18, 0, 1]],
            hostname: "host".into(),
            network: "net".into(),
            tunnel_protocol: 1,
            trust_domain: "td".into(),
            service_account: "sa".into(),
            waypoint: Some(wl::GatewayAddress::default()),
            network_gateway: Some(wl::GatewayAddress::default()),
            node: "node".into(),
            canonical_name: "cn".into(),
            canonical_revision: "cr".into(),
            workload_type: 2,
            workload_name: "wn".into(),
            native_tunnel: true,
            application_tunnel: Some(wl::ApplicationTunnel::default()),
            services: BTreeMap::from([("ns/svc".to_string(), wl::PortList::default())]),
            authorization_policies: vec!["p".into()],
            status: 1,
            cluster_id: "c".into(),
            locality: Some(wl::Locality {
                region: "r".into(),
                ..Default::default()
            }),
            network_mode: 1,
            extensions: vec![wl::Extension {
                name: "e".into(),
                ..Default::default()
            }],
            capacity: Some(3),
            ferry_eastwest_gateway: true,
            ferry_labels: BTreeMap::from([("k".to_string(), "v".to_string())]),
            ferry_terminating: true,
            ferry_dns_capture: true,
        };
        let bytes = full.encode_to_vec();
        let read = super::Workload::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(
            read.encoded_len(),
            bytes.len(),
            "a field was skipped: {read:?}"
        );
    }
}
