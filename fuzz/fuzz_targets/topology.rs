//! The topology file as `ferry control` reads it (`ferry_topology::parse`: the size and nesting
//! limits, the YAML, the semantic checks and the conversion into a snapshot). Any text is a
//! topology or a list of problems, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ferry_topology::parse("fuzz.yaml", text) {
        Ok(t) => assert!(!t.trust_domain.is_empty()),
        Err(e) => assert!(!e.problems.is_empty(), "a rejection says why"),
    }
});
