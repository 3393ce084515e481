//! Small builders of wire messages, shared by `to_wire` and `project`.

use std::net::IpAddr;

use ferry_api::security as sec;
use ferry_core::model::{Cidr, Match, StringMatch};

pub(super) fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

pub(super) fn string_match(m: &StringMatch) -> sec::StringMatch {
    use sec::string_match::MatchType;
    let t = match m {
        StringMatch::Exact(s) => MatchType::Exact(s.clone()),
        StringMatch::Prefix(s) => MatchType::Prefix(s.clone()),
        StringMatch::Suffix(s) => MatchType::Suffix(s.clone()),
        StringMatch::Presence => MatchType::Presence(()),
    };
    sec::StringMatch {
        match_type: Some(t),
    }
}

pub(super) fn cidr(c: &Cidr) -> sec::Address {
    sec::Address {
        address: ip_bytes(c.addr),
        length: u32::from(c.prefix),
    }
}

/// A match's upstream (L4) fields, as written.
pub(super) fn l4_match(m: &Match) -> sec::Match {
    let sa = |v: &[ferry_core::model::ServiceAccountMatch]| {
        v.iter()
            .map(|m| sec::ServiceAccountMatch {
                namespace: m.namespace.clone(),
                service_account: m.service_account.clone(),
            })
            .collect()
    };
    let ports = |v: &[u16]| v.iter().map(|p| u32::from(*p)).collect();
    sec::Match {
        namespaces: m.namespaces.iter().map(string_match).collect(),
        not_namespaces: m.not_namespaces.iter().map(string_match).collect(),
        principals: m.principals.iter().map(string_match).collect(),
        not_principals: m.not_principals.iter().map(string_match).collect(),
        source_ips: m.source_ips.iter().map(cidr).collect(),
        not_source_ips: m.not_source_ips.iter().map(cidr).collect(),
        destination_ips: m.destination_ips.iter().map(cidr).collect(),
        not_destination_ips: m.not_destination_ips.iter().map(cidr).collect(),
        destination_ports: ports(&m.destination_ports),
        not_destination_ports: ports(&m.not_destination_ports),
        service_accounts: sa(&m.service_accounts),
        not_service_accounts: sa(&m.not_service_accounts),
        ..Default::default()
    }
}
