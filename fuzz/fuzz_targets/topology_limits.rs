//! The linear pre-parse scan of a topology file (`ferry_topology::check_limits`, what
//! `parse_within` runs before the YAML parser), with small limits so that refusals happen. The
//! first byte picks the depth limit (0..=15); the rest is the file. Any text is admitted or
//! refused, never a panic, and a deeper limit never refuses what a shallower one admits.
#![no_main]

use ferry_topology::{Limits, check_limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&depth, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let limits = |max_depth| Limits {
        max_bytes: 1 << 20,
        max_depth,
    };
    let depth = usize::from(depth & 0x0f);
    if check_limits(text, &limits(depth)).is_ok() {
        assert!(
            check_limits(text, &limits(depth + 1)).is_ok(),
            "admitted at depth {depth}, refused at {}",
            depth + 1
        );
    }
});
