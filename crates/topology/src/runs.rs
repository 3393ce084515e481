//! A large file's YAML parsed on every core: the entries of its `workloads:` block sequence (the
//! bulk of a large mesh) in runs, each run of whole entries parsed on a thread of its own as one
//! YAML sequence, and the rest of the file, with an empty list in their place, beside them.
//!
//! Only a parse that succeeds everywhere is kept, and only for a text whose entries are laid out
//! as [`crate::kept`] finds them (one `- ` line per entry, the count the runs parsed) with no
//! YAML anchor, alias or tag among them (each would depend on text outside its run), and whose
//! text before `workloads:` parses alone (so that key is one of the file's own, not inside a
//! quoted scalar or a flow collection). Anything else, and every text that fails anywhere, is
//! parsed whole by the caller, so that every error names its line and column as it always has.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::convert::threads;
use crate::kept::layout;
use crate::schema::{File, WorkloadSpec};

/// Entries a thread parses at a time.
pub(crate) const CHUNK: usize = 1_024;

/// The chunks one thread parsed, by their index.
type Parsed = Vec<(usize, Vec<WorkloadSpec>)>;

/// `text` parsed with its workload entries in runs on every core; `None` when that is not how
/// it can be parsed (too few entries or cores, a layout or YAML not as above, any error).
pub(crate) fn parse(text: &str) -> Option<File> {
    let laid_out = layout(text)?;
    let threads = threads(laid_out.2.len());
    parse_laid_out(text, laid_out, threads, CHUNK)
}

/// [`parse`] on `threads` threads (at least two, else `None`), `chunk` entries at a time.
#[cfg(test)]
pub(crate) fn parse_on(text: &str, threads: usize, chunk: usize) -> Option<File> {
    parse_laid_out(text, layout(text)?, threads, chunk)
}

/// [`parse`] of `text` laid out as `(items, _, starts)` ([`layout`]) on `threads` threads,
/// `chunk` entries at a time.
fn parse_laid_out(
    text: &str,
    (items, _, starts): (Range<usize>, usize, Vec<usize>),
    threads: usize,
    chunk: usize,
) -> Option<File> {
    if threads < 2
        || starts.len() < threads
        || text[items.clone()]
            .bytes()
            .any(|b| matches!(b, b'&' | b'*' | b'!'))
    {
        return None;
    }
    let mut head = String::with_capacity(items.start + 8);
    head.push_str(&text[..items.start]);
    head.push_str("  []\n");
    if serde_yaml_ng::from_str::<serde::de::IgnoredAny>(&head).is_err() {
        return None;
    }
    let mut rest = head;
    rest.push_str(&text[items.end..]);
    // Chunks of whole entries that each thread takes in turn: a thread given less time on a
    // shared machine holds no one up by a whole share, and each chunk's events (the YAML
    // loader holds a whole document's) fit in memory the thread already has.
    let chunks: Vec<(usize, usize)> = starts
        .chunks(chunk.max(1))
        .map(|run| (run[0], run.len()))
        .collect();
    let next = AtomicUsize::new(0);
    let parse_chunk = |k: usize| -> Option<Vec<WorkloadSpec>> {
        let (from, count) = chunks[k];
        let to = chunks.get(k + 1).map_or(items.end, |&(next, _)| next);
        serde_yaml_ng::from_str::<Vec<WorkloadSpec>>(&text[from..to])
            .ok()
            .filter(|specs| specs.len() == count)
    };
    let (rest, parsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= chunks.len() {
                            return Some(mine);
                        }
                        let Some(specs) = parse_chunk(k) else {
                            // The whole parse says why; the other threads stop too.
                            next.store(chunks.len(), Ordering::Relaxed);
                            return None;
                        };
                        mine.push((k, specs));
                    }
                })
            })
            .collect();
        let rest = serde_yaml_ng::from_str::<File>(&rest).ok();
        let parsed: Option<Vec<Parsed>> = handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect();
        (rest, parsed)
    });
    let mut file = rest?;
    let mut in_order: Vec<Option<Vec<WorkloadSpec>>> = Vec::new();
    in_order.resize_with(chunks.len(), || None);
    for (k, specs) in parsed?.into_iter().flatten() {
        in_order[k] = Some(specs);
    }
    file.workloads = Vec::with_capacity(starts.len());
    for specs in in_order {
        file.workloads.extend(specs?);
    }
    Some(file)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::fmt::Write as _;

    use super::*;

    /// A mesh of `workloads` workloads, their entries in flow and block style, with comments
    /// between them, and sections before and after them.
    pub(crate) fn mesh(workloads: usize) -> String {
        let mut t = String::from(
            "trust_domain: cluster.local\nclusters:\n  - {name: east, network: net-east}\n  - {name: west, network: net-west}\nnodes:\n",
        );
        for n in 0..4 {
            let cluster = if n % 2 == 0 { "east" } else { "west" };
            let _ = writeln!(t, "  - {{name: node{n}, cluster: {cluster}}}");
        }
        t.push_str("services:\n");
        for s in 0..8 {
            let _ = writeln!(
                t,
                "  - {{name: svc{s}, vips: [{{network: net-east, address: 10.200.0.{}}}], ports: [{{port: 80, target_port: 8080}}], selector: {{app: svc{s}}}}}",
                s + 1
            );
        }
        t.push_str("workloads:\n  # the pods\n");
        for i in 0..workloads {
            let j = i / 2;
            let address = format!("10.{}.{}.{}", j / 62_500, j / 250 % 250, j % 250 + 1);
            if i % 3 == 0 {
                let _ = writeln!(
                    t,
                    "  - name: pod{i}\n    node: node{}\n    address: {address}\n    labels:\n      app: svc{}\n    # a comment within\n    ports: {{http: 8080}}",
                    i % 4,
                    i % 8
                );
            } else {
                let _ = writeln!(
                    t,
                    "  - {{name: pod{i}, service_account: sa{}, node: node{}, address: {address}, labels: {{app: svc{}}}, services: {{svc{}: {{80: 9090}}}}}}",
                    i % 5,
                    i % 4,
                    i % 8,
                    (i + 1) % 8
                );
            }
            if i % 100 == 0 {
                t.push_str("\n  # a comment between\n");
            }
        }
        t.push_str("policies:\n  - {name: allow-default, namespace: default, action: allow, rules: [{from: [{namespaces: [default]}]}]}\n");
        t
    }

    fn whole(text: &str) -> File {
        serde_yaml_ng::from_str(text).expect("the generated mesh parses")
    }

    #[test]
    fn a_file_parsed_in_runs_equals_it_parsed_whole() {
        let text = mesh(1_001);
        let expected = format!("{:?}", whole(&text));
        for (threads, chunk) in [(2, 1), (3, 7), (7, 100), (2, CHUNK)] {
            let file = parse_on(&text, threads, chunk).expect("parsed in runs");
            assert_eq!(file.workloads.len(), 1_001);
            assert_eq!(
                format!("{file:?}"),
                expected,
                "{threads} threads, {chunk} a chunk"
            );
        }
    }

    #[test]
    fn what_a_run_cannot_parse_alone_is_left_to_the_whole_parse() {
        let text = mesh(50);
        assert!(parse_on(&text, 2, 7).is_some());
        // An anchor and its alias in different runs.
        let anchored = text
            .replacen("name: pod1,", "name: &first pod1,", 1)
            .replacen("name: pod40,", "name: *first,", 1);
        assert!(parse_on(&anchored, 2, 7).is_none());
        // A tag.
        let tagged = text.replacen("name: pod1,", "name: !!str pod1,", 1);
        assert!(parse_on(&tagged, 2, 7).is_none());
        // `workloads:` inside a quoted scalar, not a key of the file: the whole parse has no
        // workloads, the text around the entries alone would parse.
        let quoted = text
            .replacen("workloads:\n", "root_namespace: \"x\nworkloads:\n", 1)
            .replacen("policies:\n", "\"\npolicies:\n", 1);
        assert!(whole(&quoted).workloads.is_empty());
        assert!(parse_on(&quoted, 2, 7).is_none());
        // A broken entry in the last run.
        let broken = text.replacen("name: pod49,", "name: [pod49,", 1);
        assert!(parse_on(&broken, 2, 7).is_none());
        // Too few entries for the threads.
        assert!(parse_on(&mesh(1), 2, 7).is_none());
    }

    #[test]
    fn an_error_in_the_last_run_keeps_its_line_and_column() {
        let count = 2 * crate::convert::PER_THREAD + 11;
        let text = mesh(count);
        let last = count - 1;
        assert_eq!(last % 3, 0, "the last entry is in block style");
        let bad = text.replacen(
            &format!("  - name: pod{last}\n    node: node{}\n", last % 4),
            &format!(
                "  - name: pod{last}\n    node: node{}\n    capacity: many\n",
                last % 4
            ),
            1,
        );
        let line = bad
            .lines()
            .position(|l| l == "    capacity: many")
            .expect("the broken line")
            + 1;
        assert!(parse_on(&bad, 2, 7).is_none());
        let e = crate::parse("big.yaml", &bad).expect_err("the entry does not parse");
        let message = e.to_string();
        assert!(
            message.starts_with(&format!(
                "big.yaml:{line}:15: workloads[{last}].capacity: invalid type"
            )),
            "{message}"
        );
    }
}
