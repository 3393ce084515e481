//! `parse` never panics: on arbitrary text, on YAML-looking noise, on byte-level mutations of
//! the examples, and on inputs built to exhaust the stack or memory.

use proptest::prelude::*;

use ferry_topology::parse;

const EXAMPLES: [&str; 3] = [
    include_str!("../../../examples/single-cluster.yaml"),
    include_str!("../../../examples/two-clusters.yaml"),
    include_str!("../../../examples/flat-network.yaml"),
];

/// Parses, and checks that a rejection is well-formed: at least one problem, printable.
fn check(text: &str) {
    if let Err(e) = parse("fuzz.yaml", text) {
        assert!(
            !e.problems.is_empty(),
            "a rejection names at least one problem"
        );
        assert!(e.to_string().lines().count() >= e.problems.len());
    }
}

/// One byte-level edit: overwrite, insert or delete at a position (taken modulo the length).
#[derive(Clone, Debug)]
enum Edit {
    Overwrite(usize, u8),
    Insert(usize, u8),
    Delete(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Bytes that matter to YAML are more likely than others.
    let byte = prop_oneof![
        3 => prop::sample::select(b":-[]{}#&*!|>'\"%@`, \n\t0123456789./".to_vec()),
        1 => any::<u8>(),
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Overwrite(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Delete),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for e in edits {
        let len = bytes.len();
        match *e {
            Edit::Overwrite(i, b) if len > 0 => bytes[i % len] = b,
            Edit::Insert(i, b) => bytes.insert(i % (len + 1), b),
            Edit::Delete(i) if len > 0 => {
                bytes.remove(i % len);
            }
            Edit::Overwrite(..) | Edit::Delete(_) => {}
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text(text in any::<String>()) {
        check(&text);
    }

    #[test]
    fn yaml_looking_noise(text in "[a-z_:{}\\[\\],. \n0-9/*&!-]{0,300}") {
        check(&text);
    }

    #[test]
    fn mutated_examples(which in 0..EXAMPLES.len(), edits in prop::collection::vec(edit(), 1..12)) {
        check(&apply(EXAMPLES[which], &edits));
    }

    /// Whole lines of one example spliced into another: still structurally YAML, semantically
    /// anything.
    #[test]
    fn spliced_examples(
        a in 0..EXAMPLES.len(),
        b in 0..EXAMPLES.len(),
        picks in prop::collection::vec((any::<usize>(), any::<usize>()), 1..6),
    ) {
        let mut lines: Vec<&str> = EXAMPLES[a].lines().collect();
        let donor: Vec<&str> = EXAMPLES[b].lines().collect();
        for (at, from) in picks {
            let line = donor[from % donor.len()];
            let at = at % (lines.len() + 1);
            lines.insert(at, line);
        }
        check(&lines.join("\n"));
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    for open in ["[", "{a: ", "- "] {
        let text = format!("clusters: {}", open.repeat(5_000));
        assert!(parse("deep.yaml", &text).is_err());
    }
}

#[test]
fn alias_bombs_are_rejected() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    text.push_str("clusters: *a11\n");
    let err = parse("bomb.yaml", &text).expect_err("rejected");
    assert!(!err.problems.is_empty());
}
