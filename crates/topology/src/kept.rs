//! A topology kept with its text, so that an edit of its `workloads` alone is parsed and
//! converted for the entries it touches, not for the whole file ([`Kept::edit`]).
//!
//! The text of the last good file is kept with the start of each entry of its `workloads`
//! block sequence. A new text is compared with it byte for byte from both ends (as the file is
//! read, [`Kept::read_file`]: only the stretch that differs is kept of it): when everything
//! that differs lies within the workloads' entries, only the entries covering the difference are
//! parsed (old and new, each run as one YAML sequence) and converted, together with every other
//! section of the file (which the workloads are checked against and converted with: clusters,
//! nodes, waypoints, services, policies, peer authentications, all small beside the workloads),
//! and the result is applied to the kept snapshot as a delta ([`Snapshot::apply`]). The snapshot
//! is the one a full parse of the new text gives (each workload converts on its own: its
//! placement, services, policies; what concerns several, unique uids and addresses, is checked
//! by the delta's application and here).
//!
//! The kept text is then changed where it differs ([`Kept::edit_by`]), not replaced.
//!
//! Anything else is left to a full parse ([`Kept::edit`] gives the text back): a change outside the
//! workloads, YAML anchors or aliases in the workloads, entries that are not a block sequence of
//! `- ` lines, an entry that does not parse or convert (the full parse locates the problem), a
//! delta the snapshot rejects.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use ferry_core::model::Workload;

use crate::editable::Editable;
pub use crate::editable::WorkloadEdit;
pub use crate::reread::Difference;
use crate::schema::{File, WorkloadSpec};
use crate::{Limits, Topology, TopologyError, convert, limits, reread};

/// The last good topology, its text and where its workload entries are.
#[derive(Debug)]
pub struct Kept {
    source_name: String,
    text: String,
    /// Where the entries of `workloads:` are (from the line after it to the first line that
    /// is not part of them).
    items: Range<usize>,
    /// Indentation of the entries' `- `.
    indent: usize,
    /// Where each entry starts; the first is `items.start` (it takes any blank or comment
    /// lines before the first `- `).
    starts: Vec<usize>,
    /// The file with no workloads, and the snapshot.
    workloads: Editable,
}

/// Parses and converts `text` as [`crate::parse_within`] does, keeping what [`Kept::edit`]
/// needs; `None` beside the topology when the text's workloads cannot be edited in place (it
/// still converted).
pub fn parse_kept(
    source_name: &str,
    text: String,
    limits: &Limits,
) -> Result<(Topology, Option<Kept>), TopologyError> {
    parse_keeping(source_name, text, limits).map(|(topology, kept)| (topology, kept.ok()))
}

/// [`parse_kept`], with `text` back when it is not kept (for whoever still needs it).
pub fn parse_keeping(
    source_name: &str,
    text: String,
    limits: &Limits,
) -> Result<(Topology, Result<Kept, String>), TopologyError> {
    let mut file = crate::parse_file(source_name, &text, limits)?;
    let (snapshot, trust_domain) = convert::convert(&file).map_err(|problems| TopologyError {
        file: source_name.to_string(),
        problems,
    })?;
    let topology = Topology {
        snapshot,
        trust_domain,
    };
    let count = file.workloads.len();
    file.workloads = Vec::new();
    let kept = Kept::new(source_name, text, file, count, &topology);
    Ok((topology, kept))
}

impl Kept {
    fn new(
        source_name: &str,
        text: String,
        rest: File,
        count: usize,
        topology: &Topology,
    ) -> Result<Self, String> {
        let Some((items, indent, starts)) = layout(&text) else {
            return Err(text);
        };
        // One entry per `- ` line and no anchors or aliases (an entry could use another's),
        // else the layout is not what the parser saw.
        if starts.len() != count || !plain(&text[items.clone()]) {
            return Err(text);
        }
        let Some(workloads) = Editable::new(rest, topology) else {
            return Err(text);
        };
        Ok(Self {
            source_name: source_name.to_string(),
            text,
            items,
            indent,
            starts,
            workloads,
        })
    }

    /// The topology of `text`, when it differs from the kept one in workload entries alone,
    /// with the workloads it changed; this then keeps `text`. `text` back (and this unchanged)
    /// when the edit needs a full parse.
    pub fn edit(
        &mut self,
        text: String,
        limits: &Limits,
    ) -> Result<(Topology, WorkloadEdit), String> {
        let difference = Difference::between(&self.text, &text);
        self.edit_by(&difference, limits).ok_or(text)
    }

    /// [`Kept::edit`] of the text that differs from the kept one by `difference` (as
    /// [`Kept::read_file`] gives it): the kept text is changed where it differs, not replaced.
    /// `None` (and this unchanged) when the edit needs a full parse, of
    /// [`Difference::text`].
    pub fn edit_by(
        &mut self,
        difference: &Difference,
        limits: &Limits,
    ) -> Option<(Topology, WorkloadEdit)> {
        let (topology, edit, entries) = self.try_edit(difference, limits)?;
        let (prefix, kept_end, mid) = (
            difference.prefix,
            difference.kept_end,
            difference.mid.as_str(),
        );
        let shift = |x: usize| x - kept_end + prefix + mid.len();
        let (a, b, new) = entries;
        let count = new.len();
        self.starts.splice(a..b, new);
        if mid.len() != kept_end - prefix {
            for s in &mut self.starts[a + count..] {
                *s = shift(*s);
            }
        }
        self.items = self.items.start..shift(self.items.end);
        // In place: a text that grows gets room for more (a new allocation of its size would
        // be copied into and page-faulted at each edit).
        let grows = mid.len().saturating_sub(kept_end - prefix);
        if self.text.capacity() - self.text.len() < grows {
            self.text.reserve_exact(grows + self.text.len() / 64);
        }
        self.text.replace_range(prefix..kept_end, mid);
        self.workloads.commit(&topology);
        Some((topology, edit))
    }

    /// Reads the file at `path` against the kept text ([`reread::read_against`]): `None` when
    /// it holds the kept text, else how it differs (for [`Kept::edit_by`]).
    pub fn read_file(
        &self,
        path: &Path,
        limits: &Limits,
    ) -> Result<Option<Difference>, TopologyError> {
        reread::read_against(path, limits, &self.text)
    }

    /// [`Kept::edit_by`]'s work: the topology, the edit, and the entries from `a` to `b`
    /// (excluded) replaced by entries starting where given.
    #[allow(clippy::type_complexity)]
    fn try_edit(
        &mut self,
        difference: &Difference,
        limits: &Limits,
    ) -> Option<(Topology, WorkloadEdit, (usize, usize, Vec<usize>))> {
        let (prefix, old_end, mid) = (
            difference.prefix,
            difference.kept_end,
            difference.mid.as_str(),
        );
        if prefix < self.items.start || old_end > self.items.end {
            return None;
        }
        // Entries from `a` to `b` (excluded) cover the difference, their boundaries in the
        // common prefix and suffix (a `- ` marker and the newline before it unchanged).
        let a = self
            .starts
            .iter()
            .rposition(|&s| s == self.items.start || s + self.indent + 2 <= prefix)?;
        let b = self
            .starts
            .iter()
            .position(|&s| s > old_end)
            .unwrap_or(self.starts.len());
        let old_hi = self.starts.get(b).copied().unwrap_or(self.items.end);
        if b == self.starts.len() && self.items.end < self.text.len() && self.items.end <= old_end {
            // The line ending the entries must be unchanged, newline before it included.
            return None;
        }
        let lo = self.starts[a];
        let old_mid = &self.text[lo..old_hi];
        let new_mid = [&self.text[lo..prefix], mid, &self.text[old_end..old_hi]].concat();
        let mid_starts = entry_starts(&new_mid, self.indent, a == 0)?;
        if entry_starts(old_mid, self.indent, a == 0)?.len() != b - a {
            return None;
        }
        if !plain(&new_mid) || limits::check(&new_mid, limits).is_err() {
            return None;
        }
        let removed: Vec<_> = entries(&mut self.workloads, self.indent, old_mid)?
            .iter()
            .map(|w| w.uid.clone())
            .collect();
        let added = entries(&mut self.workloads, self.indent, &new_mid)?;
        if removed.len() != b - a {
            return None;
        }
        if a + mid_starts.len() + (self.starts.len() - b) == 0 || mid_starts.len() != added.len() {
            // No workloads left (the full parse says what that means), or entries that are
            // not what the parser saw.
            return None;
        }
        let new_starts = mid_starts.iter().map(|s| lo + s).collect();
        let (topology, edit) = self.workloads.apply(&removed, added)?;
        Some((topology, edit, (a, b, new_starts)))
    }

    /// The text kept.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The name errors give the file.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }
}

/// The workloads the entries in `mid` (whole entries of the workloads sequence, indented by
/// `indent`) convert to with the rest of the file; `None` when they do not parse or convert.
fn entries(kept: &mut Editable, indent: usize, mid: &str) -> Option<Vec<Arc<Workload>>> {
    if !mid.lines().any(|l| is_item(l, indent)) {
        return Some(Vec::new());
    }
    let specs: Vec<WorkloadSpec> = serde_yaml_ng::from_str(mid).ok()?;
    kept.convert(specs)
}

/// Is `line` an entry of a sequence indented by `indent`: `indent` spaces, then `- `?
fn is_item(line: &str, indent: usize) -> bool {
    let b = line.as_bytes();
    b.len() >= indent + 2
        && b[..indent].iter().all(|&c| c == b' ')
        && &b[indent..indent + 2] == b"- "
}

/// Is `line` part of an entry without starting one: blank, a comment, or indented deeper?
fn continues(line: &str, indent: usize) -> bool {
    let trimmed = line.trim_start_matches(' ');
    trimmed.trim().is_empty() || trimmed.starts_with('#') || line.len() - trimmed.len() > indent
}

/// Where the entries of a text's `workloads:` block sequence are, their indentation and where
/// each starts (the first at the line after `workloads:`, with any comments before its `- `).
pub(crate) fn layout(text: &str) -> Option<(Range<usize>, usize, Vec<usize>)> {
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n');
    let start = loop {
        let line = lines.next()?;
        offset += line.len();
        if line.trim_end() == "workloads:" {
            break offset;
        }
    };
    let rest = &text[start..];
    let indent = rest
        .lines()
        .find(|l| {
            let t = l.trim_start_matches(' ');
            !t.trim().is_empty() && !t.starts_with('#')
        })
        .map(|l| l.len() - l.trim_start_matches(' ').len())?;
    let len = entries_len(rest, indent);
    let starts = entry_starts(&rest[..len], indent, true)?;
    Some((
        start..start + len,
        indent,
        starts.into_iter().map(|s| start + s).collect(),
    ))
}

/// How long the entries at the start of `text` are: up to the first line that is neither an
/// entry's `- ` nor part of one.
fn entries_len(text: &str, indent: usize) -> usize {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if !is_item(line, indent) && !continues(line, indent) {
            break;
        }
        at += line.len();
    }
    at
}

/// Where the entries of `text` start (offsets in it): 0, then each `- ` line after the first.
/// With `leading`, lines before the first `- ` belong to it (comments, blank lines); else the
/// text must start with a `- `. An empty list when there is no `- ` (and not `leading`);
/// `None` when a line belongs to no entry.
fn entry_starts(text: &str, indent: usize, leading: bool) -> Option<Vec<usize>> {
    let mut starts = vec![0];
    let mut seen = false;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if is_item(line, indent) {
            if seen {
                starts.push(at);
            }
            seen = true;
        } else if !continues(line, indent) || (at == 0 && !leading) {
            return None;
        }
        at += line.len();
    }
    match (seen, leading) {
        (true, _) => Some(starts),
        (false, false) => Some(Vec::new()),
        (false, true) => None,
    }
}

/// No YAML anchor or alias (`&`, `*`) in `text`.
fn plain(text: &str) -> bool {
    !text.bytes().any(|b| b == b'&' || b == b'*')
}
