//! The topology file read against the text kept from the last good one ([`crate::kept::Kept`]):
//! the file is read a block at a time, each block compared with the kept text as it comes (at
//! the same offset, and at the same distance from the end), and what is kept of the file is the
//! stretch where the two differ ([`Difference`]). An unchanged file costs one read into a small
//! buffer and one comparison, no copy of its text; an edit of one entry, that and the stretch
//! around it. A file read whole and compared after costs a buffer of its size (page faults),
//! its UTF-8 check and a second pass over both texts for the comparison.

use std::io::Read;
use std::path::Path;

use crate::{Limits, TopologyError};

/// Bytes read and compared at once: small enough to stay in a core's cache between the read and
/// the comparison (64 KiB read 12 MB and compared it in 1.1 ms here; 4 MiB took 2 ms).
const CHUNK: usize = 64 << 10;

/// Bytes compared at once by [`common_prefix`] and [`common_suffix`] (a slice comparison is a
/// `memcmp`; byte by byte, a file of 10 MB took milliseconds).
const BLOCK: usize = 4096;

/// How a text differs from a kept one: the kept text's first `prefix` bytes, then `mid`, then
/// the kept text from `kept_end` on. `prefix` and `kept_end` are character boundaries of the
/// kept text (so of the new one too); an equal text has an empty `mid` and
/// `prefix == kept_end`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Difference {
    pub prefix: usize,
    pub kept_end: usize,
    pub mid: String,
}

impl Difference {
    /// How `new` differs from `kept`: the longest common start, then the longest common end
    /// of what is left (the two never overlap), both shortened to character boundaries.
    pub fn between(kept: &str, new: &str) -> Self {
        let (old, new_b) = (kept.as_bytes(), new.as_bytes());
        let prefix = common_prefix(old, new_b);
        let most = old.len().min(new_b.len()) - prefix;
        let suffix = common_suffix(&old[prefix..], &new_b[prefix..]).min(most);
        let (prefix, kept_end) = widened(kept, prefix, old.len() - suffix);
        let new_end = new.len() - (kept.len() - kept_end);
        Self {
            prefix,
            kept_end,
            mid: new[prefix..new_end].to_string(),
        }
    }

    /// Whether the new text is the kept one.
    pub fn is_empty(&self) -> bool {
        self.prefix == self.kept_end && self.mid.is_empty()
    }

    /// The new text's length, `kept` being the text it differs from.
    pub fn len(&self, kept: &str) -> usize {
        kept.len() - (self.kept_end - self.prefix) + self.mid.len()
    }

    /// The new text whole, `kept` being the text it differs from.
    pub fn text(&self, kept: &str) -> String {
        let mut text = String::with_capacity(self.len(kept));
        text.push_str(&kept[..self.prefix]);
        text.push_str(&self.mid);
        text.push_str(&kept[self.kept_end..]);
        text
    }
}

/// Reads the file at `path` as [`crate::read_file_within`] does (the same errors) and compares
/// it with `kept` while reading: `None` when it holds the same bytes, else how it differs.
pub fn read_against(
    path: &Path,
    limits: &Limits,
    kept: &str,
) -> Result<Option<Difference>, TopologyError> {
    let whole = || {
        crate::read_file_within(path, limits).map(|text| {
            let d = Difference::between(kept, &text);
            (!d.is_empty()).then_some(d)
        })
    };
    let Ok(mut file) = std::fs::File::open(path) else {
        return whole();
    };
    let Some(len) = file
        .metadata()
        .ok()
        .and_then(|m| usize::try_from(m.len()).ok())
        .filter(|&len| len <= limits.max_bytes)
    else {
        return whole();
    };
    let mut buf = vec![0; CHUNK];
    match compare(&mut file, len, kept.as_bytes(), &mut buf) {
        Ok(Compared::Same) => Ok(None),
        Ok(Compared::Differs {
            prefix,
            suffix,
            mid,
        }) => {
            // Widened to character boundaries of the kept text, the stretch is valid UTF-8
            // exactly when the whole new text is (its two ends are whole kept text).
            let (lo, kept_end) = widened(kept, prefix, kept.len() - suffix);
            let mut bytes = Vec::with_capacity(mid.len() + (prefix - lo) + 3);
            bytes.extend_from_slice(&kept.as_bytes()[lo..prefix]);
            bytes.extend_from_slice(&mid);
            bytes.extend_from_slice(&kept.as_bytes()[kept.len() - suffix..kept_end]);
            match String::from_utf8(bytes) {
                Ok(mid) => Ok(Some(Difference {
                    prefix: lo,
                    kept_end,
                    mid,
                })),
                // Read whole, for the error the whole text gives.
                Err(_) => whole(),
            }
        }
        // Another length than the file had when opened (written to while read), or an error:
        // read whole, as before, for the same text or the same error.
        Ok(Compared::NotLen) | Err(_) => whole(),
    }
}

/// What [`compare`] found.
#[derive(Debug, PartialEq, Eq)]
enum Compared {
    Same,
    /// The new text is the kept one's first `prefix` bytes, `mid`, then its last `suffix`.
    Differs {
        prefix: usize,
        suffix: usize,
        mid: Vec<u8>,
    },
    /// The text read was not `len` bytes long.
    NotLen,
}

/// Reads `r`, expected to hold `len` bytes, through `buf`, and compares it with `kept` as it
/// comes. Byte `i` of the new text is compared with byte `i` of the kept one until they first
/// differ (at `prefix`); from there on with the kept byte as far from the end (byte
/// `i + kept.len() - len`), if that lies at or after `prefix`, and the new bytes up to the last
/// that differs are all that is kept of it (those it skipped that turn out to be needed are the
/// kept text's). The result is what comparing the whole texts gives: the longest common start, then
/// the longest common end of what is left.
fn compare(
    r: &mut impl Read,
    len: usize,
    kept: &[u8],
    buf: &mut [u8],
) -> std::io::Result<Compared> {
    let mut at = 0;
    let mut prefix = None;
    // The new bytes from `prefix` to `end` (the last that differed, so far), as read.
    let mut mid = Vec::new();
    let mut end = 0;
    loop {
        let k = match r.read(buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if k > len - at {
            return Ok(Compared::NotLen);
        }
        let piece = &buf[..k];
        let from = match prefix {
            Some(_) => at,
            None => {
                let m = common_prefix(kept.get(at..).unwrap_or_default(), piece);
                if m == k {
                    at += k;
                    continue;
                }
                prefix = Some(at + m);
                end = at + m;
                at + m
            }
        };
        let p = prefix.unwrap_or_default();
        // The first new byte whose kept counterpart (as far from the end) lies at or after
        // `p`; those before it differ whatever they hold.
        let first = (p + len).saturating_sub(kept.len()).clamp(from, at + k);
        let mut last = if first > from { first } else { 0 };
        if first < at + k {
            let j = first + kept.len() - len;
            let n = at + k - first;
            let same = common_suffix(&kept[j..j + n], &piece[first - at..]);
            if same < n {
                last = at + k - same;
            }
        }
        if last > end {
            if end < at {
                // Skipped as equal to the kept text's bytes as far from the end.
                let j = end + kept.len() - len;
                mid.extend_from_slice(&kept[j..j + (at - end)]);
                end = at;
            }
            mid.extend_from_slice(&piece[end - at..last - at]);
            end = last;
        }
        at += k;
    }
    if at != len {
        return Ok(Compared::NotLen);
    }
    Ok(match prefix {
        None if at == kept.len() => Compared::Same,
        // The new text is the start of the kept one.
        None => Compared::Differs {
            prefix: at,
            suffix: 0,
            mid,
        },
        Some(p) => Compared::Differs {
            prefix: p,
            suffix: len - end.max(p),
            mid,
        },
    })
}

/// `prefix` moved back and `kept_end` on to character boundaries of `kept`.
fn widened(kept: &str, mut prefix: usize, mut kept_end: usize) -> (usize, usize) {
    while !kept.is_char_boundary(prefix) {
        prefix -= 1;
    }
    while !kept.is_char_boundary(kept_end) {
        kept_end += 1;
    }
    (prefix, kept_end)
}

/// How many bytes `a` and `b` start with in common.
pub(crate) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= n && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    at + a[at..n]
        .iter()
        .zip(&b[at..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// How many bytes `a` and `b` end with in common.
pub(crate) fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut at = n;
    while at >= BLOCK && a[at - BLOCK..at] == b[at - BLOCK..at] {
        at -= BLOCK;
    }
    n - at
        + a[..at]
            .iter()
            .rev()
            .zip(b[..at].iter().rev())
            .take_while(|(x, y)| x == y)
            .count()
}

#[cfg(test)]
#[path = "reread_tests.rs"]
mod tests;
