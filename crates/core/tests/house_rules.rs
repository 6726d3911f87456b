//! The house rules of `sandbox-core` that a compiler does not check (docs/ARCHITECTURE.md,
//! "Module layers"; CONTRIBUTING.md, "House conventions"):
//!
//! - no file under `crates/core/src/` is longer than [`MAX_LINES`] lines;
//! - the crate's top-level modules import each other without a circle: every `crate::x`
//!   path in code (comments and `#[cfg(test)]` modules aside) points to a module below the
//!   one using it. A directory module (`decision/`) counts as one module: its files are one
//!   concern split by check group;
//! - every citation of the design in the repository's tracked files resolves
//!   (`every_design_citation_resolves`): `docs/ARCHITECTURE.md principle N` and a bare
//!   `principle N` name a principle that exists there, a section citation such as
//!   `docs/ARCHITECTURE.md, "Module layers"` names one of its headings, and nothing cites the design document that is not in the
//!   repository (the design sketch this replaced).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The longest a source file of the core may be, lines.
const MAX_LINES: usize = 700;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level module a file belongs to (`decision/idle.rs` → `decision`), `None` for
/// the crate root.
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src_dir()).expect("file under src");
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib").then_some(name)
}

/// The modules `text` names as `crate::<module>` in code: comment lines and everything
/// from the first `#[cfg(test)]` on are skipped (unit tests may reach anywhere).
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
            rest = after;
        }
    }
    out
}

/// The import graph of the core's top-level modules: module → modules it imports.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(&src_dir());
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for f in &files {
        let Some(m) = module_of(f) else { continue };
        let text = fs::read_to_string(f).expect("read source");
        for target in imports(&text) {
            if target != m && modules.contains(&target) {
                graph.get_mut(&m).expect("known module").insert(target);
            }
        }
    }
    graph
}

/// One circle in `graph`, as the modules along it (first repeated last), if any.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut circle = path[i..].to_vec();
            circle.push(m.to_owned());
            return Some(circle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_core_source_file_exceeds_700_lines() {
    let long: Vec<String> = rust_files(&src_dir())
        .iter()
        .filter_map(|f| {
            let n = fs::read_to_string(f).expect("read source").lines().count();
            (n > MAX_LINES).then(|| format!("{} has {n} lines", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them by concern): {long:#?}"
    );
}

#[test]
fn core_modules_import_no_circle() {
    let graph = import_graph();
    // The check must see the layers it guards: the decision imports the types it returns.
    assert!(
        graph["decision"].contains("outcome") && graph["record"].contains("evidence"),
        "the import scan found no edges: {graph:#?}"
    );
    if let Some(circle) = find_circle(&graph) {
        panic!(
            "import circle in sandbox-core: {}; a module may import only modules below it",
            circle.join(" -> ")
        );
    }
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let edge = |a: &str, b: &[&str]| {
        (
            a.to_owned(),
            b.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>(),
        )
    };
    let circle: BTreeMap<_, _> = [
        edge("decision", &["evidence"]),
        edge("evidence", &["record"]),
        edge("record", &["decision"]),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        find_circle(&circle),
        Some(vec![
            "decision".to_owned(),
            "evidence".to_owned(),
            "record".to_owned(),
            "decision".to_owned()
        ])
    );
    let layered: BTreeMap<_, _> = [
        edge("decision", &["evidence", "record"]),
        edge("record", &["evidence"]),
        edge("evidence", &[]),
    ]
    .into_iter()
    .collect();
    assert_eq!(find_circle(&layered), None);
}

// --- Citations of the design (docs/ARCHITECTURE.md). ---

/// The repository root (`crates/core/../..`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The old design document's name, which no file may cite (built here so that this file
/// does not cite it).
fn dangling_document() -> String {
    ["DESIGN", ".md"].concat()
}

/// The files a citation may be in: every tracked or new (not ignored) text file of the
/// repository, per `git ls-files`.
fn repository_text_files() -> Vec<PathBuf> {
    let root = repo_root();
    let out = Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ])
        .current_dir(&root)
        .output()
        .expect("git runs (the citation check lists the repository's files with it)");
    assert!(out.status.success(), "git ls-files failed: {out:?}");
    let text_ext = [
        "rs", "md", "toml", "py", "ts", "yaml", "yml", "sh", "mk", "json", "txt",
    ];
    out.stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| text_ext.iter().any(|t| e == *t))
                || p.file_name().is_some_and(|n| n == "Makefile")
        })
        .filter(|p| p.is_file())
        .collect()
}

/// What docs/ARCHITECTURE.md offers to cite: its principle numbers (headings
/// `### Principle N: ...`) and every heading's text.
struct Citable {
    principles: BTreeSet<u32>,
    headings: BTreeSet<String>,
}

fn citable(architecture: &str) -> Citable {
    let mut principles = BTreeSet::new();
    let mut headings = BTreeSet::new();
    for line in architecture.lines() {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#').trim();
        if let Some(rest) = heading.strip_prefix("Principle ") {
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = n.parse() {
                principles.insert(n);
            }
        }
        headings.insert(heading.to_owned());
    }
    Citable {
        principles,
        headings,
    }
}

/// The citations in `text` that do not resolve, as `file:line: why`.
fn dangling_citations(file: &str, text: &str, doc: &Citable) -> Vec<String> {
    let mut out = Vec::new();
    let old = dangling_document();
    for (i, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", i + 1);
        if line.contains(&old) {
            out.push(format!(
                "{at}: cites {old}, which is not in the repository (cite docs/ARCHITECTURE.md)"
            ));
        }
        // `principle N`, with or without the document's name before it.
        let lower = line.to_ascii_lowercase();
        let mut rest = lower.as_str();
        while let Some(k) = rest.find("principle ") {
            let after = &rest[k + "principle ".len()..];
            let n: String = after.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = n.parse::<u32>()
                && !doc.principles.contains(&n)
            {
                out.push(format!(
                    "{at}: cites principle {n}; docs/ARCHITECTURE.md has principles {:?}",
                    doc.principles
                ));
            }
            rest = after;
        }
        // A section: the document's name, a comma, the heading in double quotes.
        let mut rest = line;
        while let Some(k) = rest.find("ARCHITECTURE.md, \"") {
            let after = &rest[k + "ARCHITECTURE.md, \"".len()..];
            match after.split_once('"') {
                Some((heading, tail)) => {
                    if !doc.headings.contains(heading) {
                        out.push(format!(
                            "{at}: cites the heading \"{heading}\", which docs/ARCHITECTURE.md does not have"
                        ));
                    }
                    rest = tail;
                }
                None => {
                    out.push(format!(
                        "{at}: a heading citation must close its quote on the same line"
                    ));
                    break;
                }
            }
        }
    }
    out
}

#[test]
fn every_design_citation_resolves() {
    let root = repo_root();
    let architecture =
        fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md exists");
    let doc = citable(&architecture);
    assert_eq!(
        doc.principles,
        (1..=8).collect::<BTreeSet<u32>>(),
        "docs/ARCHITECTURE.md numbers its principles 1 to 8, as the code cites them"
    );
    let files = repository_text_files();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("crates/core/src/decision/mod.rs")),
        "the scan sees the source: {} files",
        files.len()
    );
    let mut dangling = Vec::new();
    let mut citations = 0;
    for f in &files {
        let Ok(text) = fs::read_to_string(f) else {
            continue; // not UTF-8: no citation in it
        };
        citations += text.matches("ARCHITECTURE.md principle").count();
        let name = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        dangling.extend(dangling_citations(&name, &text, &doc));
    }
    assert!(citations > 0, "no citation found: the scan is broken");
    assert!(
        dangling.is_empty(),
        "citations that do not resolve:\n{}",
        dangling.join("\n")
    );
}

#[test]
fn a_citation_that_does_not_resolve_is_named_with_its_file_and_line() {
    let doc = citable("# A\n### Principle 1: One\n### Principle 2: Two\n## Module layers\n");
    // Spelled in pieces, so that the repository scan does not read these as citations.
    let (arch, p) = ("docs/ARCHITECTURE.md", "principle");
    let text = format!(
        "ok: {arch} {p} 2\n\
         bad: {arch} {p} 9\n\
         old: {old} {p} 1\n\
         ok: {arch}, \"Module layers\"\n\
         bad: ({p} 3: a bare one)\n\
         bad: {arch}, \"Module layer\"\n",
        old = dangling_document()
    );
    let found = dangling_citations("x.rs", &text, &doc);
    let lines: Vec<&str> = found
        .iter()
        .map(|f| f.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        lines,
        ["x.rs:2", "x.rs:3", "x.rs:5", "x.rs:6"],
        "{found:#?}"
    );
}
