//! The limits checked before the YAML parser runs: a hostile file is refused in linear time with
//! its location, and the pre-scan never counts a nesting shallower than the parser builds.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use ferry_topology::{Limits, parse_within};

fn limits(max_depth: usize) -> Limits {
    Limits {
        max_bytes: usize::MAX,
        max_depth,
    }
}

/// How deep the YAML parser nests `v` (a scalar is 0). A mapping's keys count one level up:
/// libyaml (and the pre-scan) opens a block mapping only at the `:` after its first key, so
/// a collection as a key is scanned before the mapping around it is open.
fn depth(v: &serde_yaml_ng::Value) -> usize {
    match v {
        serde_yaml_ng::Value::Sequence(s) => 1 + s.iter().map(depth).max().unwrap_or(0),
        serde_yaml_ng::Value::Mapping(m) => {
            1 + m
                .iter()
                .map(|(k, v)| depth(k).saturating_sub(1).max(depth(v)))
                .max()
                .unwrap_or(0)
        }
        serde_yaml_ng::Value::Tagged(t) => depth(&t.value),
        _ => 0,
    }
}

/// If the parser accepts `text` and nests it `d` deep, the pre-scan refuses it at depth `d - 1`.
fn never_shallower(text: &str) {
    let Ok(v) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) else {
        return;
    };
    let d = depth(&v);
    if d == 0 {
        return;
    }
    let err = parse_within("scan.yaml", text, &limits(d - 1))
        .expect_err("deeper than the limit: refused");
    assert!(
        err.to_string().contains("deep"),
        "{text:?} nests {d} deep but the pre-scan let it through at {}: {err}",
        d - 1
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn the_prescan_is_never_shallower_than_the_parser(
        text in "([\\[\\]{}'\",:#|>?&*!-]|a|b| |  |\n|\n  |\n    ){0,60}"
    ) {
        never_shallower(&text);
    }
}

#[test]
fn quoting_and_continuations_seen_as_the_parser_sees_them() {
    for text in [
        "a: [b, 'c]', [d]]\n",
        "a: \"x\\\"]\" \nb: [[1]]\n",
        "a: it's\nb: [[1]]\n",
        "a: b\n  'c\nd: [[1]]\n",
        "a: |\n  x\nb: [[1]]\n",
        "a: >2\n   x\n  y\nb: [[1]]\n",
        "- a: [x,\n  'y', [z]]\n",
        "? [a, [b]]\n: c\n",
        "a: !t [b, [c]]\n",
        "[a, [b], {c: [d]}]\n",
    ] {
        never_shallower(text);
    }
}

#[test]
fn ten_mib_of_nesting_is_refused_in_linear_time_with_its_location() {
    let text = format!("clusters: {}", "[".repeat(10 << 20));
    let start = Instant::now();
    let err = parse_within("deep.yaml", &text, &Limits::default()).expect_err("refused");
    let took = start.elapsed();
    assert_eq!(
        err.to_string(),
        "deep.yaml:1:74: expected nesting at most 64 deep (flow collections and indented blocks \
         together), found deeper nesting here"
    );
    // Generous for a debug build on a loaded machine; the quadratic parse takes minutes.
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn the_size_limit_applies_to_files_and_text() {
    let err = parse_within(
        "big.yaml",
        "clusters: []\n",
        &Limits {
            max_bytes: 8,
            max_depth: 64,
        },
    )
    .expect_err("too big");
    assert!(
        err.to_string().contains("at most 8 bytes, found 13 bytes"),
        "{err}"
    );
    let path = std::env::temp_dir().join(format!("ferry-limits-{}.yaml", std::process::id()));
    std::fs::write(&path, "clusters: []\n").unwrap();
    let err = ferry_topology::load_file_within(
        &path,
        &Limits {
            max_bytes: 8,
            max_depth: 64,
        },
    )
    .expect_err("too big");
    let _ = std::fs::remove_file(&path);
    assert!(
        err.to_string().contains("at most 8 bytes, found more"),
        "{err}"
    );
}
