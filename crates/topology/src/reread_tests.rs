use proptest::prelude::*;

use super::*;

/// The common start, then the common end of what is left, byte by byte.
fn reference(a: &[u8], b: &[u8]) -> (usize, usize) {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (prefix, suffix)
}

/// A text longer than a block or two and the same with a stretch replaced (maybe by one of
/// another length, maybe by nothing), from a small alphabet so that runs repeat.
fn pair() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (
        0..3 * BLOCK,
        0..3 * BLOCK,
        0..3 * BLOCK,
        proptest::collection::vec(0u8..3, 0..20),
    )
        .prop_map(|(len, i, j, with)| {
            let a: Vec<u8> = (0..len).map(|k| (k % 7) as u8).collect();
            let (i, j) = (i.min(len), j.min(len));
            let (i, j) = (i.min(j), i.max(j));
            let mut b = a[..i].to_vec();
            b.extend(&with);
            b.extend(&a[j..]);
            (a, b)
        })
}

/// Gives at most `most` bytes a read, then at most the rest of what it holds.
struct Trickle<'a> {
    data: &'a [u8],
    most: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.data.len().min(self.most).min(out.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn compared(kept: &[u8], new: &[u8], most: usize, chunk: usize) -> Compared {
    let mut buf = vec![0; chunk];
    compare(&mut Trickle { data: new, most }, new.len(), kept, &mut buf).expect("no I/O error")
}

proptest! {
    /// Compared a block at a time, the common start and end are those compared byte by byte.
    #[test]
    fn common_ends_are_those_found_byte_by_byte((a, b) in pair()) {
        let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let suffix = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
        prop_assert_eq!(common_prefix(&a, &b), prefix);
        prop_assert_eq!(common_suffix(&a, &b), suffix);
    }

    /// Read in pieces of any size and compared as they come, a text differs from the kept one
    /// where the whole texts compared byte by byte do, and the stretch kept is the new text's.
    #[test]
    fn compared_while_read_is_compared_whole(
        (kept, new) in pair(),
        most in 1usize..5000,
        chunk in 1usize..300,
    ) {
        let (prefix, suffix) = reference(&kept, &new);
        let got = compared(&kept, &new, most, chunk);
        if kept == new {
            prop_assert_eq!(got, Compared::Same);
        } else {
            let mid = new[prefix..new.len() - suffix].to_vec();
            prop_assert_eq!(got, Compared::Differs { prefix, suffix, mid });
        }
    }

    /// Swapped, so the new text is sometimes longer and sometimes shorter.
    #[test]
    fn compared_while_read_is_compared_whole_either_way(
        (new, kept) in pair(),
        chunk in 1usize..300,
    ) {
        let (prefix, suffix) = reference(&kept, &new);
        let got = compared(&kept, &new, usize::MAX, chunk);
        if kept == new {
            prop_assert_eq!(got, Compared::Same);
        } else {
            let mid = new[prefix..new.len() - suffix].to_vec();
            prop_assert_eq!(got, Compared::Differs { prefix, suffix, mid });
        }
    }

    /// A difference rebuilds the new text, and its ends are character boundaries.
    #[test]
    fn a_difference_rebuilds_the_text(
        kept in "[a-cé€ \n]{0,40}",
        new in "[a-cé€ \n]{0,40}",
        cut in 0usize..40,
    ) {
        // Often the same but for a stretch.
        let new = format!("{}{new}", kept.chars().take(cut).collect::<String>());
        let d = Difference::between(&kept, &new);
        prop_assert_eq!(d.text(&kept), new.as_str());
        prop_assert_eq!(d.len(&kept), new.len());
        prop_assert_eq!(d.is_empty(), kept == new);
    }
}

/// A text that is the start of the kept one, or the kept one with more after it.
#[test]
fn a_text_that_ends_early_or_goes_on_differs_at_the_end() {
    let kept = b"abcdef";
    assert_eq!(
        compared(kept, b"abc", 2, 2),
        Compared::Differs {
            prefix: 3,
            suffix: 0,
            mid: Vec::new()
        }
    );
    assert_eq!(
        compared(kept, b"abcdefgh", 3, 3),
        Compared::Differs {
            prefix: 6,
            suffix: 0,
            mid: b"gh".to_vec()
        }
    );
    assert_eq!(compared(b"", b"", 1, 1), Compared::Same);
    // Fewer or more bytes than the length it was opened with.
    let mut buf = vec![0; 4];
    let short = compare(
        &mut Trickle {
            data: b"ab",
            most: 4,
        },
        3,
        kept,
        &mut buf,
    );
    assert_eq!(short.expect("read"), Compared::NotLen);
    let long = compare(
        &mut Trickle {
            data: b"abcd",
            most: 4,
        },
        3,
        kept,
        &mut buf,
    );
    assert_eq!(long.expect("read"), Compared::NotLen);
}

/// Read from a file: the same bytes are `None`; an edit is its stretch, widened to whole
/// characters; a text that is not UTF-8, or too large, gives the error a whole read gives.
#[test]
fn a_file_read_against_the_kept_text() {
    let path = std::env::temp_dir().join(format!("ferry-reread-{}.yaml", std::process::id()));
    let limits = Limits::default();
    let kept = format!(
        "{}- {{name: pé}}\n{}",
        "# a\n".repeat(40_000),
        "# b\n".repeat(40_000)
    );
    std::fs::write(&path, &kept).expect("written");
    assert_eq!(read_against(&path, &limits, &kept).expect("read"), None);

    // é (c3 a9) becomes è (c3 a8): the bytes differ in the second, the stretch is the whole
    // character.
    let edited = kept.replace("pé", "pè");
    std::fs::write(&path, &edited).expect("written");
    let d = read_against(&path, &limits, &kept)
        .expect("read")
        .expect("differs");
    assert_eq!(d.mid, "è");
    assert_eq!(d.text(&kept), edited);

    let mut bad = kept.clone().into_bytes();
    bad[160_010] = 0xff;
    std::fs::write(&path, &bad).expect("written");
    let whole = crate::read_file_within(&path, &limits).expect_err("not UTF-8");
    let against = read_against(&path, &limits, &kept).expect_err("not UTF-8");
    assert_eq!(against.to_string(), whole.to_string());

    let small = Limits {
        max_bytes: 1000,
        ..limits
    };
    std::fs::write(&path, &edited).expect("written");
    let whole = crate::read_file_within(&path, &small).expect_err("too large");
    let against = read_against(&path, &small, &kept).expect_err("too large");
    assert_eq!(against.to_string(), whole.to_string());

    let _ = std::fs::remove_file(&path);
    let gone = read_against(&path, &limits, &kept).expect_err("no file");
    assert!(
        gone.to_string()
            .contains("expected a readable UTF-8 topology file")
    );
}
