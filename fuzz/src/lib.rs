//! What the fuzz targets share: the framing of the `xds` target's input, and the writer of its
//! seeds (encoded from the example topologies by the real encoder).

use std::path::Path;

use ferry_api::security as sec;
use ferry_api::workload as wl;
use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_xds::resources::ResourceSet;
use prost::Message;

/// The type of one framed resource: the low bit of its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Address,
    Authorization,
}

/// The `xds` target's input: frames of `tag (1 byte) | length (2 bytes, little-endian) |
/// body`, one resource each (a short last frame takes what is left).
pub fn frames(mut data: &[u8]) -> Vec<(Kind, &[u8])> {
    let mut out = Vec::new();
    while let [tag, lo, hi, rest @ ..] = data {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        let kind = if tag & 1 == 0 {
            Kind::Address
        } else {
            Kind::Authorization
        };
        out.push((kind, &rest[..len]));
        data = &rest[len..];
    }
    out
}

/// The resource name the control plane gives `body` (what `decode_address` and
/// `decode_authorization` check it against), or `""` if it does not decode.
pub fn resource_name(kind: Kind, body: &[u8]) -> String {
    match kind {
        Kind::Address => match wl::Address::decode(body).ok().and_then(|a| a.r#type) {
            Some(wl::address::Type::Workload(w)) => w.uid,
            Some(wl::address::Type::Service(s)) => format!("{}/{}", s.namespace, s.hostname),
            None => String::new(),
        },
        Kind::Authorization => sec::Authorization::decode(body)
            .map(|a| format!("{}/{}", a.namespace, a.name))
            .unwrap_or_default(),
    }
}

/// Frames every resource the control plane would serve for `set`.
pub fn frame_set(set: &ResourceSet) -> Vec<u8> {
    let mut out = Vec::new();
    for (type_url, tag) in [(ADDRESS_TYPE, 0u8), (AUTHORIZATION_TYPE, 1)] {
        for v in set.of_type(type_url).into_iter().flat_map(|t| t.values()) {
            let Ok(len) = u16::try_from(v.body.len()) else {
                continue;
            };
            out.push(tag);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&v.body);
        }
    }
    out
}

/// Writes one `xds` seed per example topology in `examples` into `dir`, as
/// `seed-<example>.bin`: every resource of the topology, encoded as the control plane does.
pub fn write_xds_seeds(examples: &Path, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut paths: Vec<_> = std::fs::read_dir(examples)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let topo = ferry_topology::load_file(&path)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let framed = frame_set(&ResourceSet::encode(&topo.snapshot));
        std::fs::write(dir.join(format!("seed-{stem}.bin")), framed)?;
    }
    Ok(())
}
