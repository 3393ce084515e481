//! Bounds on a topology file, checked in one linear pass before the YAML parser runs.
//!
//! The YAML parser (libyaml, through `serde_yaml_ng`) keeps one "simple key" slot per open flow
//! collection and walks all of them on every token, so a file of nested `[` or `{` parses in
//! time quadratic in its size (50 KB took 13 s). [`check`] bounds the size and the nesting depth
//! first, in time linear in the size, so the parser only ever sees shallow input.
//!
//! The scan follows libyaml's scanner where it decides what is structure and what is text:
//! quotes and comments open only where a token starts, plain scalars run on over lines as far as
//! libyaml lets them (by the enclosing block's indentation, or to the next flow indicator),
//! block scalars (`|`, `>`) take the lines indented past their parent, and block indentation is
//! rolled and unrolled as libyaml does. Where the two could still differ, the parse runs under
//! the caller's time budget (`ferry control` runs it on a thread of its own).

use crate::error::{Location, Problem};

/// What [`check`] admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest file, in bytes.
    pub max_bytes: usize,
    /// The deepest nesting: open flow collections (`[`, `{`) and indented blocks together.
    pub max_depth: usize,
}

impl Limits {
    /// 64 MiB: about a million workloads.
    pub const DEFAULT_MAX_BYTES: usize = 64 << 20;
    /// Real files nest 6 to 8 deep.
    pub const DEFAULT_MAX_DEPTH: usize = 64;
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: Self::DEFAULT_MAX_BYTES,
            max_depth: Self::DEFAULT_MAX_DEPTH,
        }
    }
}

/// Checks `text` against `limits` without parsing it; the problem names where it went wrong.
pub(crate) fn check(text: &str, limits: &Limits) -> Result<(), Problem> {
    if text.len() > limits.max_bytes {
        return Err(Problem::new(
            "",
            format!(
                "expected a topology file of at most {} bytes, found {} bytes",
                limits.max_bytes,
                text.len()
            ),
        ));
    }
    Scan::new(text.as_bytes(), limits.max_depth).run()
}

/// libyaml forgets a simple key candidate this many bytes after it started.
const SIMPLE_KEY_SPAN: usize = 1024;

/// The scanner's state: a position, the open flow collections and the block indentation stack.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    line: usize,
    /// In characters, 0-based.
    col: usize,
    max_depth: usize,
    /// The open flow collections, innermost last: whether each is a sequence, and whether a
    /// `key: value` pair (an implicit one-pair mapping, one level deeper) is open in it.
    flow: Vec<(bool, bool)>,
    /// How many of `flow` have a pair open.
    pairs: usize,
    /// Columns of the open block collections, innermost last.
    indents: Vec<usize>,
    /// Whether each of `indents` is a sequence (a `-` opened it).
    seqs: Vec<bool>,
    /// Whether a simple key (`key:`) may start here.
    allowed: bool,
    /// Where the last simple key candidate started: (byte, line, column).
    key: Option<(usize, usize, usize)>,
}

// === impl Scan ===

impl<'a> Scan<'a> {
    fn new(b: &'a [u8], max_depth: usize) -> Self {
        Self {
            b,
            i: 0,
            line: 0,
            col: 0,
            max_depth,
            flow: Vec::new(),
            pairs: 0,
            indents: Vec::new(),
            seqs: Vec::new(),
            allowed: true,
            key: None,
        }
    }

    fn at(&self, k: usize) -> Option<u8> {
        self.b.get(self.i + k).copied()
    }

    fn blankz(&self, k: usize) -> bool {
        matches!(self.at(k), None | Some(b' ' | b'\t' | b'\n' | b'\r'))
    }

    fn is_break(&self) -> bool {
        matches!(self.at(0), Some(b'\n' | b'\r'))
    }

    fn is_blank(&self) -> bool {
        matches!(self.at(0), Some(b' ' | b'\t'))
    }

    fn advance(&mut self) {
        match self.at(0) {
            Some(b'\n') => {
                self.line += 1;
                self.col = 0;
            }
            // A lone CR or the CR of CRLF: the LF (if any) ends the line.
            Some(b'\r') if self.at(1) != Some(b'\n') => {
                self.line += 1;
                self.col = 0;
            }
            Some(b'\r') => {}
            // UTF-8 continuation bytes do not start a character.
            Some(c) if c & 0xC0 == 0x80 => {}
            Some(_) => self.col += 1,
            None => return,
        }
        self.i += 1;
    }

    fn skip_line(&mut self) {
        while self.at(0).is_some() && !self.is_break() {
            self.advance();
        }
    }

    fn depth(&self) -> usize {
        self.flow.len() + self.pairs + self.indents.len()
    }

    fn in_flow(&self) -> bool {
        !self.flow.is_empty()
    }

    /// `?` or `:` in a flow sequence opens a one-pair mapping there.
    fn open_pair(&mut self) -> Result<(), Problem> {
        if let Some((true, pair @ false)) = self.flow.last_mut() {
            *pair = true;
            self.pairs += 1;
            if self.depth() > self.max_depth {
                return Err(self.too_deep());
            }
        }
        Ok(())
    }

    /// `,` or the end of the collection closes the pair.
    fn close_pair(&mut self) {
        if let Some((_, pair @ true)) = self.flow.last_mut() {
            *pair = false;
            self.pairs -= 1;
        }
    }

    fn too_deep(&self) -> Problem {
        Problem {
            location: Some(Location {
                line: self.line + 1,
                column: self.col + 1,
            }),
            path: String::new(),
            message: format!(
                "expected nesting at most {} deep (flow collections and indented blocks together), \
                 found deeper nesting here",
                self.max_depth
            ),
        }
    }

    /// libyaml's `roll_indent`: a block collection opens at `col` in block context.
    fn roll(&mut self, col: usize, seq: bool) -> Result<(), Problem> {
        let top = self.indents.last().copied();
        // An indentless sequence (`key:` then `- item` in the key's own column) is a level of
        // its own to the parser though it opens no new column.
        let indentless = seq && top == Some(col) && self.seqs.last() == Some(&false);
        if !self.in_flow() && (top.is_none_or(|top| top < col) || indentless) {
            self.indents.push(col);
            self.seqs.push(seq);
            if self.depth() > self.max_depth {
                return Err(self.too_deep());
            }
        }
        Ok(())
    }

    /// The column a plain scalar's next line must reach to continue it (libyaml's
    /// `parser->indent + 1`).
    fn continuation_column(&self) -> usize {
        self.indents.last().map_or(0, |top| top + 1)
    }

    fn key_candidate(&mut self) {
        if self.allowed {
            self.key = Some((self.i, self.line, self.col));
        }
    }

    fn run(mut self) -> Result<(), Problem> {
        loop {
            self.skip_to_next_token();
            let Some(c) = self.at(0) else {
                return Ok(());
            };
            let before = self.i;
            if !self.in_flow() {
                // libyaml's `unroll_indent`: blocks indented past this token have ended.
                while self.indents.last().is_some_and(|&top| top > self.col) {
                    self.indents.pop();
                    self.seqs.pop();
                }
                // A key back in an indentless sequence's column ends that sequence.
                if c != b'-'
                    && self.seqs.last() == Some(&true)
                    && self.indents.len() >= 2
                    && self.indents[self.indents.len() - 2] == self.col
                {
                    self.indents.pop();
                    self.seqs.pop();
                }
            }
            if self.col == 0 && (c == b'-' || c == b'.') && self.document_marker() {
                self.indents.clear();
                self.seqs.clear();
                self.key = None;
                self.allowed = false;
                for _ in 0..3 {
                    self.advance();
                }
                continue;
            }
            if self.col == 0 && c == b'%' {
                self.skip_line();
                continue;
            }
            match c {
                b'[' | b'{' => {
                    self.key_candidate();
                    self.flow.push((c == b'[', false));
                    if self.depth() > self.max_depth {
                        return Err(self.too_deep());
                    }
                    self.allowed = true;
                    self.advance();
                }
                b']' | b'}' => {
                    self.close_pair();
                    self.flow.pop();
                    self.allowed = false;
                    self.advance();
                }
                b',' => {
                    self.close_pair();
                    self.allowed = true;
                    self.key = None;
                    self.advance();
                }
                b'-' if self.blankz(1) => {
                    self.roll(self.col, true)?;
                    self.allowed = true;
                    self.key = None;
                    self.advance();
                }
                b'?' if self.in_flow() || self.blankz(1) => {
                    self.roll(self.col, false)?;
                    self.open_pair()?;
                    self.allowed = !self.in_flow();
                    self.key = None;
                    self.advance();
                }
                b':' if self.in_flow() || self.blankz(1) => {
                    let col = match self.key {
                        Some((i, line, col))
                            if line == self.line && self.i - i < SIMPLE_KEY_SPAN =>
                        {
                            col
                        }
                        _ => self.col,
                    };
                    self.roll(col, false)?;
                    self.open_pair()?;
                    self.allowed = !self.in_flow();
                    self.key = None;
                    self.advance();
                }
                b'*' | b'&' | b'!' => {
                    self.key_candidate();
                    self.allowed = false;
                    self.property();
                }
                b'|' | b'>' if !self.in_flow() => {
                    self.key = None;
                    self.block_scalar();
                    self.allowed = true;
                }
                b'\'' => {
                    self.key_candidate();
                    self.single_quoted();
                    self.allowed = false;
                }
                b'"' => {
                    self.key_candidate();
                    self.double_quoted();
                    self.allowed = false;
                }
                _ => {
                    self.key_candidate();
                    self.allowed = self.plain();
                }
            }
            if self.i == before {
                // Whatever libyaml makes of it, it is one character of no structure.
                self.advance();
            }
        }
    }

    /// `---` or `...` followed by a blank, at column 0.
    fn document_marker(&self) -> bool {
        let c = self.at(0);
        c.is_some() && self.at(1) == c && self.at(2) == c && self.blankz(3)
    }

    /// Blanks, line breaks and comments between tokens.
    fn skip_to_next_token(&mut self) {
        if self.i == 0 && self.b.starts_with("\u{feff}".as_bytes()) {
            self.i = 3;
        }
        loop {
            match self.at(0) {
                Some(b' ' | b'\t') => self.advance(),
                Some(b'#') => self.skip_line(),
                Some(b'\n' | b'\r') => {
                    self.advance();
                    if !self.in_flow() {
                        self.allowed = true;
                    }
                }
                _ => return,
            }
        }
    }

    /// An anchor or alias (`&name`, `*name`: letters, digits, `-`, `_`), or a tag (`!...`: up
    /// to a blank or, in a flow collection, a flow indicator).
    fn property(&mut self) {
        let tag = self.at(0) == Some(b'!');
        self.advance();
        while !self.blankz(0) {
            let c = self.at(0).unwrap_or(b' ');
            if !(tag || c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
                return;
            }
            if self.in_flow() && matches!(c, b',' | b'[' | b']' | b'{' | b'}') {
                return;
            }
            self.advance();
        }
    }

    fn single_quoted(&mut self) {
        self.advance();
        while let Some(c) = self.at(0) {
            self.advance();
            if c == b'\'' {
                if self.at(0) == Some(b'\'') {
                    self.advance();
                } else {
                    return;
                }
            }
        }
    }

    fn double_quoted(&mut self) {
        self.advance();
        while let Some(c) = self.at(0) {
            self.advance();
            match c {
                b'\\' => self.advance(),
                b'"' => return,
                _ => {}
            }
        }
    }

    /// A plain scalar, over as many lines as libyaml takes into it. True when it ended after a
    /// line break (libyaml then allows a simple key).
    fn plain(&mut self) -> bool {
        let mut after_break = false;
        loop {
            if self.col == 0 && self.document_marker() {
                return after_break;
            }
            if self.at(0) == Some(b'#') {
                return after_break;
            }
            while !self.blankz(0) {
                let c = self.at(0);
                if c == Some(b':') && (self.blankz(1) || self.in_flow()) {
                    return after_break;
                }
                if self.in_flow() && matches!(c, Some(b',' | b'[' | b']' | b'{' | b'}')) {
                    return after_break;
                }
                after_break = false;
                self.advance();
            }
            if self.at(0).is_none() {
                return after_break;
            }
            while self.is_blank() || self.is_break() {
                if self.is_break() {
                    after_break = true;
                }
                self.advance();
            }
            if !self.in_flow() && self.col < self.continuation_column() {
                return after_break;
            }
        }
    }

    /// `|` or `>`: the header line, then every line indented at least as far as the first
    /// non-empty one (and past the parent block), or empty.
    fn block_scalar(&mut self) {
        let parent = self.indents.last().copied();
        self.advance();
        let mut increment = None;
        while self.at(0).is_some() && !self.is_break() {
            match self.at(0) {
                Some(d @ b'1'..=b'9') if increment.is_none() => {
                    increment = Some(usize::from(d - b'0'))
                }
                Some(b'#') => self.skip_line(),
                _ => {}
            }
            if self.at(0).is_some() && !self.is_break() {
                self.advance();
            }
        }
        self.advance();
        let min = parent.map_or(1, |p| p + 1).max(1);
        let mut indent = increment.map(|n| parent.map_or(n, |p| p + n));
        let mut widest_blank = 0;
        loop {
            let start = (self.i, self.line, self.col);
            let mut spaces = 0;
            while self.at(0) == Some(b' ') {
                spaces += 1;
                self.advance();
            }
            if self.at(0).is_none() {
                return;
            }
            if self.is_break() {
                widest_blank = widest_blank.max(spaces);
                self.advance();
                continue;
            }
            let need = *indent.get_or_insert(spaces.max(widest_blank).max(min));
            if spaces < need {
                // Not ours: the next token starts on this line.
                (self.i, self.line, self.col) = start;
                return;
            }
            self.skip_line();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(text: &str, max_depth: usize) -> bool {
        check(
            text,
            &Limits {
                max_bytes: usize::MAX,
                max_depth,
            },
        )
        .is_ok()
    }

    #[test]
    fn flow_nesting_is_counted_and_located() {
        assert!(depth_ok("a: [[[1]]]\n", 4));
        assert!(!depth_ok("a: [[[1]]]\n", 3));
        let err = check(
            "a: 1\nb: [[[[\n",
            &Limits {
                max_bytes: 100,
                max_depth: 3,
            },
        )
        .unwrap_err();
        assert_eq!(err.location, Some(Location { line: 2, column: 6 }));
        assert!(err.message.contains("at most 3 deep"), "{}", err.message);
    }

    #[test]
    fn quotes_comments_and_block_scalars_hide_brackets() {
        assert!(depth_ok("a: '[[[['\nb: \"[[[[\\\"[[\"\n", 1));
        assert!(depth_ok("a: 1 # [[[[\n", 1));
        assert!(depth_ok("a: |\n  [[[[\n  'x\nb: 1\n", 1));
        // In block context a `[` inside a plain scalar is text.
        assert!(depth_ok("a: b[[[[\n", 1));
    }

    #[test]
    fn a_quote_inside_or_continuing_a_plain_scalar_opens_nothing() {
        // `it's` is one plain scalar; the brackets after it are structure.
        assert!(!depth_ok("a: it's\nb: [[[[']\n", 3));
        // A continuation line of a plain scalar starting with a quote.
        assert!(!depth_ok("a: b\n  'c\nd: [[[[\n", 3));
        // In a flow collection, a plain scalar ends at a bracket.
        assert!(!depth_ok("a: [b'[[[[\n", 3));
        // A block scalar ends at a line indented no further than its parent.
        assert!(!depth_ok("a: |\n  x\nb: [[[[\n", 3));
    }

    #[test]
    fn block_indentation_counts() {
        let deep: String = (0..10)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert!(depth_ok(&deep, 10));
        assert!(!depth_ok(&deep, 9));
        assert!(!depth_ok("- - - - - x\n", 4));
    }

    #[test]
    fn the_examples_pass_the_defaults() {
        for text in [
            include_str!("../../../examples/single-cluster.yaml"),
            include_str!("../../../examples/two-clusters.yaml"),
            include_str!("../../../examples/flat-network.yaml"),
        ] {
            check(text, &Limits::default()).unwrap();
            assert!(depth_ok(text, 12), "real files are shallow");
        }
    }

    #[test]
    fn size_is_checked_first() {
        let err = check(
            "a: 1\n",
            &Limits {
                max_bytes: 4,
                max_depth: 64,
            },
        )
        .unwrap_err();
        assert!(
            err.message.contains("at most 4 bytes, found 5"),
            "{}",
            err.message
        );
    }
}
