//! Errors: every problem of a topology file, each located as precisely as it can be.

use std::fmt;

/// A position in the file, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// One problem in a topology file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where in the text, when known (syntax and type errors know it; semantic errors do not).
    pub location: Option<Location>,
    /// Where in the document, e.g. `services[2].ports[0].target_port` or
    /// `workloads[3] (sleep).node`. Empty for the document as a whole.
    pub path: String,
    /// What was expected and what was found.
    pub message: String,
}

impl Problem {
    /// A problem without a place in the text, at `path` of the document (empty for all of it).
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            location: None,
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Why a topology file was rejected: the file and every problem found in it.
///
/// `Display` prints one problem per line, as `file:line:column: path: message` (the line and
/// column only when known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyError {
    /// The file name the caller gave (the `source_name` of [`crate::parse`]).
    pub file: String,
    /// At least one problem, in document order as far as possible.
    pub problems: Vec<Problem>,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.problems.is_empty() {
            return write!(f, "{}: invalid topology", self.file);
        }
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(&self.file)?;
            if let Some(l) = p.location {
                write!(f, ":{}:{}", l.line, l.column)?;
            }
            if !p.path.is_empty() {
                write!(f, ": {}", p.path)?;
            }
            write!(f, ": {}", p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for TopologyError {}

/// Turns a syntax or type error into a problem.
pub(crate) fn from_yaml(err: &serde_path_to_error::Error<serde_yaml_ng::Error>) -> Problem {
    let inner = err.inner();
    let mark = inner.location();
    let location = mark.as_ref().map(|l| Location {
        line: l.line(),
        column: l.column(),
    });
    let mut path = match err.path().to_string() {
        p if p == "." => String::new(),
        p => p,
    };
    let mut message = inner.to_string();
    // serde_yaml_ng adds the position and its own path (the path of the enclosing node) to the
    // text: both are reported separately, so take them out.
    if let Some(l) = &mark {
        let at = format!(" at line {} column {}", l.line(), l.column());
        if let Some(i) = message.find(&at) {
            message.replace_range(i..i + at.len(), "");
        }
    }
    if let Some(rest) = ancestors(&path).find_map(|p| message.strip_prefix(&format!("{p}: "))) {
        message = rest.to_string();
    }
    // serde says "missing field `x`" about the enclosing map: point at the field instead, and
    // say what was expected and found.
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        path = if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        message = "expected a value for this required field, found none".to_string();
    } else if let Some(field) = message
        .strip_prefix("duplicate field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        message = format!("expected each key once, found `{field}` twice");
    }
    for (rust, human) in [
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        ("expected a boolean", "expected true or false"),
    ] {
        if let Some(m) = message.strip_suffix(rust) {
            message = format!("{m}{human}");
        }
    }
    // serde's own messages name both sides ("invalid type: string \"x\", expected u16"); the
    // YAML parser's ("did not find expected node content") only describe the syntax problem.
    let serde_shaped = ["invalid ", "unknown ", "expected "]
        .iter()
        .any(|p| message.starts_with(p))
        || message.contains("found");
    if !serde_shaped {
        message = format!("expected well-formed YAML, found a syntax problem: {message}");
    }
    Problem {
        location,
        path,
        message,
    }
}

/// `a[0].b.c`, `a[0].b`, `a[0]`, `a`: the path and each of its ancestors, longest first.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let cuts = path
        .char_indices()
        .filter(|(_, c)| matches!(c, '.' | '['))
        .map(|(i, _)| i);
    let mut all: Vec<&str> = cuts
        .filter_map(|i| path.get(..i))
        .filter(|p| !p.is_empty())
        .collect();
    all.push(path);
    all.into_iter().rev().filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_longest_first() {
        let all: Vec<&str> = ancestors("services[2].ports[0].target_port").collect();
        assert_eq!(
            all,
            [
                "services[2].ports[0].target_port",
                "services[2].ports[0]",
                "services[2].ports",
                "services[2]",
                "services",
            ]
        );
        assert_eq!(ancestors("").count(), 0);
    }

    #[test]
    fn display_one_problem_per_line() {
        let err = TopologyError {
            file: "x.yaml".into(),
            problems: vec![
                Problem {
                    location: Some(Location {
                        line: 12,
                        column: 5,
                    }),
                    path: "services[2].ports[0].target_port".into(),
                    message: "expected a, found b".into(),
                },
                Problem::new("workloads[3] (sleep).node", "expected c, found d"),
                Problem::new("", "expected e, found f"),
            ],
        };
        assert_eq!(
            err.to_string(),
            "x.yaml:12:5: services[2].ports[0].target_port: expected a, found b\n\
             x.yaml: workloads[3] (sleep).node: expected c, found d\n\
             x.yaml: expected e, found f"
        );
    }
}
