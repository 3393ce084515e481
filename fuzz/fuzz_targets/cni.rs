//! What `ferry cni` reads: the network configuration the runtime writes to the plugin's stdin
//! (`spec::parse_conf`, then the result ADD prints from it), `CNI_ARGS` (`spec::parse_args`),
//! and the plugin's questions as the node agent reads them (`wire::Ask`). The first byte picks
//! the parser. Any input is a value or an error naming what was wrong, never a panic; a
//! configuration that parses gives a result that is its `prevResult` in its version, and a
//! question that parses encodes back to itself.
#![no_main]

use ferry_cni::spec::{add_result, parse_args, parse_conf};
use ferry_cni::wire::Ask;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            if let Ok(conf) = parse_conf(rest) {
                match add_result(&conf) {
                    Ok(r) => assert_eq!(r["cniVersion"], conf.cni_version.as_str()),
                    Err(e) => assert!(conf.prev_result.is_none(), "{e}"),
                }
            }
        }
        1 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = parse_args(text);
            }
        }
        _ => {
            if let Ok(ask) = serde_json::from_slice::<Ask>(rest) {
                let line = serde_json::to_string(&ask).expect("a question encodes");
                let back: Ask = serde_json::from_str(&line).expect("and decodes");
                assert_eq!(back, ask);
            }
        }
    }
});
