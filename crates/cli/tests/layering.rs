//! The workspace's layering, checked on every test run (issue 13's first acceptance line).
//!
//! **Crates.** Every workspace crate has a floor (`FLOORS`); a normal or build dependency on
//! another workspace crate must point to a lower floor. Crates on one floor never depend on each
//! other. Dev-dependencies are not checked: a test may link anything (the `tls` tests start a
//! real CA from `control`). On top of the floors, `FORBIDDEN` lists edges that no path of normal
//! dependencies may take, direct or transitive: the data plane (xDS client, runtime, the three
//! programs) links neither the control plane nor the topology file format. A crate missing from
//! `FLOORS` fails the test, so a new crate is placed on purpose.
//!
//! **Modules.** Within one crate's `src/`, the module tree is rebuilt from `mod` declarations
//! (honouring `#[path]`) and each file's `crate::`, `super::` and `self::` paths (in `use` trees,
//! grouped or not, and inline in code) are mapped to the module file they land in. The rule:
//!
//! - a module may refer to its ancestors (a child using its parent's types is normal Rust) and to
//!   its descendants (a parent using or re-exporting its children);
//! - between two modules of which neither contains the other, references may go one way only.
//!   Each reference is lifted to the two sibling subtrees it crosses (`route/decide.rs` →
//!   `snapshot.rs` is an edge `route` → `snapshot`), and two siblings that refer to each other are
//!   an import cycle. This is the cycle the design review calls out.
//!
//! Left out of the scan: comments (intra-doc links are not imports), the bodies of inline
//! `mod x { .. }` blocks (today only unit tests and generated wire types) and modules declared
//! under `#[cfg(test)]`. A path through a re-export at an ancestor (`crate::plan` re-exported from
//! `crate::route`) counts as a reference to the ancestor, so it is not seen.
//!
//! Cycles that exist today are listed in `ALLOWED_CYCLES`, each with its reason: the list may only
//! shrink (an entry that no longer matches fails the test too).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Floors, lowest first. A crate depends only on crates of lower floors.
const FLOORS: &[&[&str]] = &[
    // Pure decisions over the mesh model; the benchmarks' instruction-count gates (a
    // dev-dependency only, of no program).
    &["ferry-core", "ferry-gate"],
    // The topology file format (used by control and lab only); generated wire types.
    &["ferry-topology", "ferry-api"],
    // rustls configurations, SAN checks, the certificate manager and the CA client; the
    // translation of Kubernetes objects into a topology.
    &["ferry-tls", "ferry-k8s"],
    // The HBONE protocol.
    &["ferry-hbone"],
    // The delta-ADS client and the model <-> wire conversion.
    &["ferry-xds"],
    // The control plane (CA, xDS server, file source); what the data-plane programs share.
    &["ferry-control", "ferry-runtime"],
    // One crate per data-plane program.
    &["ferry-node", "ferry-waypoint", "ferry-gateway", "ferry-cni"],
    // All of `ferry lab`.
    &["ferry-lab"],
    // The binary: argument parsing only.
    &["ferry"],
];

/// The crates linked into the data-plane programs' own code.
const DATA_PLANE: &[&str] = &[
    "ferry-runtime",
    "ferry-node",
    "ferry-waypoint",
    "ferry-gateway",
];

/// `(from, to, why)`: no crate of `from` may reach `to` through normal dependencies, direct or not.
const FORBIDDEN: &[(&[&str], &str, &str)] = &[
    (
        &["ferry-xds"],
        "ferry-topology",
        "the xDS client does not link the topology file format",
    ),
    (
        &["ferry-xds"],
        "ferry-tls",
        "the xDS client does not link the CA client or certificates",
    ),
    (
        DATA_PLANE,
        "ferry-control",
        "the data plane does not link the control plane",
    ),
    (
        DATA_PLANE,
        "ferry-k8s",
        "the data plane learns the mesh from xDS only, never from Kubernetes objects",
    ),
    (
        DATA_PLANE,
        "ferry-topology",
        "the data plane learns the mesh from xDS only",
    ),
];

/// `(crate, module, module, why)`: sibling modules that still refer to each other. Shrink only.
const ALLOWED_CYCLES: &[(&str, &str, &str, &str)] = &[];

// === crates ===

struct Package {
    name: String,
    /// Normal and build dependencies on other workspace crates.
    deps: Vec<String>,
    /// The root source file of each lib and bin target.
    roots: Vec<PathBuf>,
}

/// The workspace, read once per test binary (`cargo metadata` takes most of the run).
fn workspace() -> &'static [Package] {
    static WORKSPACE: OnceLock<Vec<Package>> = OnceLock::new();
    WORKSPACE.get_or_init(read_workspace)
}

fn read_workspace() -> Vec<Package> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .filter_map(|d| d["name"].as_str())
                .filter(|n| names.contains(n))
                .map(str::to_owned)
                .collect();
            let roots = p["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .filter(|t| {
                    t["kind"].as_array().is_some_and(|k| {
                        k.iter()
                            .any(|k| matches!(k.as_str(), Some("lib" | "bin" | "proc-macro")))
                    })
                })
                .map(|t| PathBuf::from(t["src_path"].as_str().expect("src_path")))
                .collect();
            Package {
                name: p["name"].as_str().expect("name").to_owned(),
                deps,
                roots,
            }
        })
        .collect()
}

fn floor_of(name: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&name))
}

/// Every crate's normal dependencies point to a lower floor, and no forbidden edge is reachable.
#[test]
fn crates_depend_only_downward() {
    let packages = workspace();
    let mut problems = Vec::new();
    for p in packages {
        let Some(floor) = floor_of(&p.name) else {
            problems.push(format!("{} has no floor in FLOORS: place it", p.name));
            continue;
        };
        for d in &p.deps {
            match floor_of(d) {
                Some(to) if to < floor => {}
                Some(to) if to == floor => {
                    problems.push(format!("{} -> {d}: both on floor {floor}", p.name))
                }
                Some(to) => problems.push(format!(
                    "{} (floor {floor}) -> {d} (floor {to}): points upward",
                    p.name
                )),
                None => {} // reported as that crate's own problem
            }
        }
    }
    let graph: BTreeMap<&str, Vec<&str>> = packages
        .iter()
        .map(|p| (p.name.as_str(), p.deps.iter().map(String::as_str).collect()))
        .collect();
    for (froms, to, why) in FORBIDDEN {
        for from in *froms {
            if let Some(path) = path_between(&graph, from, to) {
                problems.push(format!("{}: {why}", path.join(" -> ")));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "crate layering broken:\n  {}",
        problems.join("\n  ")
    );
}

/// A dependency path from `from` to `to`, if there is one (depth-first).
fn path_between<'a>(
    graph: &BTreeMap<&'a str, Vec<&'a str>>,
    from: &'a str,
    to: &str,
) -> Option<Vec<&'a str>> {
    let mut stack = vec![vec![from]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = *path.last().expect("non-empty");
        if last == to {
            return Some(path);
        }
        if !seen.insert(last) {
            continue;
        }
        for next in graph.get(last).into_iter().flatten() {
            let mut longer = path.clone();
            longer.push(next);
            stack.push(longer);
        }
    }
    None
}

#[test]
fn the_floors_name_only_workspace_crates() {
    let packages = workspace();
    let names: BTreeSet<&str> = packages.iter().map(|p| p.name.as_str()).collect();
    for name in FLOORS.iter().flat_map(|f| f.iter()) {
        assert!(
            names.contains(name),
            "FLOORS names {name}, which is not a workspace crate"
        );
    }
}

// === modules ===

/// One module backed by a file: its path from the crate root (`[]` for the root).
#[derive(Debug)]
struct ModFile {
    path: Vec<String>,
    file: PathBuf,
}

/// The file-backed modules of one crate, from its root file down its `mod` declarations.
fn module_files(root: &Path) -> Vec<ModFile> {
    let mut out = Vec::new();
    let mut todo = vec![ModFile {
        path: Vec::new(),
        file: root.to_owned(),
    }];
    while let Some(m) = todo.pop() {
        let text =
            fs::read_to_string(&m.file).unwrap_or_else(|e| panic!("{}: {e}", m.file.display()));
        let dir = m.file.parent().expect("file dir").to_owned();
        let stem = m
            .file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("file stem");
        // Where children of this file live without a #[path]: next to a mod-rs file, else in a
        // directory named after the file.
        let child_dir = if m.path.is_empty() || stem == "mod" {
            dir.clone()
        } else {
            dir.join(stem)
        };
        for decl in mod_declarations(&text) {
            let file = match decl.path_attr {
                Some(p) => dir.join(p),
                None => {
                    let flat = child_dir.join(format!("{}.rs", decl.name));
                    if flat.exists() {
                        flat
                    } else {
                        child_dir.join(&decl.name).join("mod.rs")
                    }
                }
            };
            let mut path = m.path.clone();
            path.push(decl.name);
            todo.push(ModFile { path, file });
        }
        out.push(m);
    }
    out
}

struct ModDecl {
    name: String,
    path_attr: Option<String>,
}

/// `mod name;` declarations at the top level of a file, skipping those under `#[cfg(test)]`.
fn mod_declarations(text: &str) -> Vec<ModDecl> {
    let mut decls = Vec::new();
    let mut attrs: Vec<&str> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[") {
            attrs.push(line);
            continue;
        }
        let rest = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        if let Some(name) = rest.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            let test_only = attrs.iter().any(|a| a.starts_with("#[cfg(test)]"));
            let path_attr = attrs.iter().find_map(|a| {
                a.strip_prefix("#[path = \"")
                    .and_then(|p| p.strip_suffix("\"]"))
                    .map(str::to_owned)
            });
            if !test_only {
                decls.push(ModDecl {
                    name: name.trim().to_owned(),
                    path_attr,
                });
            }
        }
        if !line.starts_with("//") {
            attrs.clear();
        }
    }
    decls
}

/// The code of a file without comments, string contents and inline `mod x { .. }` bodies.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '"' => {
                out.push('"');
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '"' && !escaped {
                        break;
                    }
                    escaped = c == '\\' && !escaped;
                }
                out.push('"');
            }
            _ => out.push(c),
        }
    }
    drop_inline_modules(&out)
}

/// Removes the bodies of inline modules (`mod tests { .. }`), counting braces.
fn drop_inline_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut depth_to_skip: Option<usize> = None;
    let mut depth = 0usize;
    for line in code.lines() {
        let t = line.trim();
        let rest = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        let opens_inline = depth_to_skip.is_none()
            && rest
                .strip_prefix("mod ")
                .is_some_and(|r| r.trim_end().ends_with('{'));
        if opens_inline {
            depth_to_skip = Some(depth);
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if depth_to_skip.is_none() {
            out.push_str(line);
            out.push('\n');
        } else if depth_to_skip == Some(depth) {
            depth_to_skip = None;
        }
    }
    out
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Colons,
    Open,
    Close,
    Comma,
    Other,
}

fn tokens(code: &str) -> Vec<Tok> {
    let mut toks = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_alphanumeric() || c == '_' {
            let mut ident = String::new();
            while let Some(&c) = chars.peek() {
                if !(c.is_alphanumeric() || c == '_') {
                    break;
                }
                ident.push(c);
                chars.next();
            }
            toks.push(Tok::Ident(ident));
            continue;
        }
        chars.next();
        match c {
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                toks.push(Tok::Colons);
            }
            '{' => toks.push(Tok::Open),
            '}' => toks.push(Tok::Close),
            ',' => toks.push(Tok::Comma),
            c if c.is_whitespace() => {}
            _ => toks.push(Tok::Other),
        }
    }
    toks
}

/// Every path starting with `crate`, `super` or `self` in a file, with `use` groups expanded,
/// as written (first segment included).
fn local_paths(code: &str) -> Vec<Vec<String>> {
    let toks = tokens(code);
    let mut paths = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let starts = matches!(&toks[i], Tok::Ident(s) if s == "crate" || s == "super" || s == "self")
            && toks.get(i + 1) == Some(&Tok::Colons)
            && (i == 0 || toks[i - 1] != Tok::Colons);
        if starts {
            i = path_tree(&toks, i, Vec::new(), &mut paths);
        } else {
            i += 1;
        }
    }
    paths
}

/// Reads one path (with `{a, b::c}` groups) from `toks[i..]`, pushing every full path; returns
/// the index after it.
fn path_tree(
    toks: &[Tok],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::Colons) {
                    i += 1;
                    continue;
                }
                out.push(prefix);
                return i;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    i = path_tree(toks, i, prefix.clone(), out);
                    match toks.get(i) {
                        Some(Tok::Comma) => i += 1,
                        Some(Tok::Close) => return i + 1,
                        _ => return i,
                    }
                }
            }
            _ => {
                // `use crate::x::*;` or a path that ends in `::<T>` and the like.
                out.push(prefix);
                return i;
            }
        }
    }
}

/// The module a written path lands in, as the longest known module prefix of its absolute form.
fn resolve(
    from: &[String],
    written: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut abs: Vec<String> = from.to_vec();
    let mut rest = written;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            abs.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                abs.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    // `self` inside a group (`use crate::route::{self, Plan}`) names the module itself.
    abs.extend(rest.iter().filter(|s| *s != "self").cloned());
    (0..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|p| modules.contains(p))
}

/// Sibling-subtree edges of one crate: `(a, b) -> an example file reference a -> b`.
fn sibling_edges(root: &Path) -> BTreeMap<(String, String), String> {
    let files = module_files(root);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|m| m.path.clone()).collect();
    let mut edges = BTreeMap::new();
    for m in &files {
        let text = fs::read_to_string(&m.file).expect("readable source");
        for written in local_paths(&code_only(&text)) {
            let Some(target) = resolve(&m.path, &written, &modules) else {
                continue;
            };
            let common = m
                .path
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == m.path.len() || common == target.len() {
                continue; // one contains the other
            }
            let a = m.path[..=common].join("::");
            let b = target[..=common].join("::");
            let example = format!("{} uses {}", rel(root, &m.file), written.join("::"));
            edges.entry((a, b)).or_insert(example);
        }
    }
    edges
}

fn rel(root: &Path, file: &Path) -> String {
    let src = root.parent().expect("src dir");
    file.strip_prefix(src).unwrap_or(file).display().to_string()
}

/// No two sibling modules of one crate refer to each other, apart from `ALLOWED_CYCLES`.
#[test]
fn no_module_imports_its_sibling_back() {
    // (crate, a, b) with a < b -> the two references that close the cycle.
    let mut found = BTreeMap::new();
    for p in workspace() {
        for root in &p.roots {
            let edges = sibling_edges(root);
            for ((a, b), there) in &edges {
                if let Some(back) = edges.get(&(b.clone(), a.clone())).filter(|_| a < b) {
                    found.insert(
                        (p.name.clone(), a.clone(), b.clone()),
                        format!("{there}; {back}"),
                    );
                }
            }
        }
    }
    let allowed: BTreeSet<(String, String, String)> = ALLOWED_CYCLES
        .iter()
        .map(|(c, a, b, _)| (c.to_string(), a.min(b).to_string(), a.max(b).to_string()))
        .collect();
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(k, _)| !allowed.contains(*k))
        .map(|((c, a, b), why)| format!("{c}: {a} <-> {b} ({why})"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "modules that import each other:\n  {}",
        unexpected.join("\n  ")
    );
    let gone: Vec<_> = allowed.iter().filter(|k| !found.contains_key(*k)).collect();
    assert!(
        gone.is_empty(),
        "ALLOWED_CYCLES entries that no longer exist (delete them): {gone:?}"
    );
}

#[test]
fn the_scanner_sees_grouped_and_nested_paths() {
    let code = code_only(
        "use crate::route::{self, plan::Plan, trace::{NoTrace, Trace}};\n\
         // use crate::commented::Out;\n\
         fn f() { super::lb::pick(); let s = \"crate::quoted\"; }\n\
         #[cfg(test)]\nmod tests {\n    use crate::inner::Only;\n}\n",
    );
    let paths: Vec<String> = local_paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        paths,
        [
            "crate::route::self",
            "crate::route::plan::Plan",
            "crate::route::trace::NoTrace",
            "crate::route::trace::Trace",
            "super::lb::pick",
        ]
    );
}

#[test]
fn the_module_tree_skips_test_modules_and_follows_paths() {
    let decls = mod_declarations(
        "mod a;\n#[cfg(test)]\n#[path = \"a_tests.rs\"]\nmod tests;\n#[path = \"x.rs\"]\npub(crate) mod b;\n",
    );
    let got: Vec<(&str, Option<&str>)> = decls
        .iter()
        .map(|d| (d.name.as_str(), d.path_attr.as_deref()))
        .collect();
    assert_eq!(got, [("a", None), ("b", Some("x.rs"))]);

    let m = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let modules: BTreeSet<Vec<String>> =
        [m(&[]), m(&["route"]), m(&["route", "decide"]), m(&["lb"])].into();
    let from = m(&["route", "decide"]);
    let at = |w: &[&str]| resolve(&from, &m(w), &modules);
    assert_eq!(at(&["super", "Plan"]), Some(m(&["route"])));
    assert_eq!(at(&["super", "super", "lb", "choose"]), Some(m(&["lb"])));
    assert_eq!(at(&["crate", "lb"]), Some(m(&["lb"])));
    assert_eq!(at(&["self", "helper"]), Some(m(&["route", "decide"])));
}
