//! xDS resources as the client applies a response (`ferry_xds::client`): each
//! `istio.workload.Address` and `istio.security.Authorization` body decoded and converted
//! (`decode_address`, `decode_authorization`), the accepted ones held by name, then one snapshot
//! assembled from them (`ferry_xds::assemble::assemble`), which sets aside what breaks it.
//!
//! The input is framed resources (`ferry_fuzz::frames`); each is named as the control plane
//! names it, so that decoding gets past the name check. The seeds are every resource of the
//! example topologies; `FERRY_FUZZ_WRITE_SEEDS=<dir>` makes the target write them there first
//! (`fuzz/run.sh` documents it).
#![no_main]

use std::path::Path;
use std::sync::Arc;

use ferry_fuzz::{Kind, frames, resource_name, write_xds_seeds};
use ferry_xds::assemble::{Held, assemble};
use ferry_xds::convert::{Decoded, decode_address, decode_authorization};
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        if let Some(dir) = std::env::var_os("FERRY_FUZZ_WRITE_SEEDS") {
            let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
            write_xds_seeds(&examples, Path::new(&dir)).expect("writing the xds seeds");
        }
    },
    |data: &[u8]| {
        let mut held = Held::default();
        for (kind, body) in frames(data) {
            let name = resource_name(kind, body);
            match kind {
                Kind::Address => {
                    if let Ok(d) = decode_address(&name, body) {
                        if let Decoded::Workload(w) = &d {
                            assert_eq!(w.uid.as_str(), name);
                        }
                        held.addresses.insert(name.into(), d);
                    }
                }
                Kind::Authorization => {
                    if let Ok(p) = decode_authorization(&name, body) {
                        held.policies.insert(name, Arc::new(p));
                    }
                }
            }
        }
        let (snap, set_aside) = assemble(&held, 1);
        if snap.is_none() {
            assert!(!set_aside.is_empty(), "no snapshot says why");
        }
    }
);
