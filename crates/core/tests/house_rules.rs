//! The house rules of `sandbox-core` that a compiler does not check (docs/ARCHITECTURE.md,
//! "Module layers"; CONTRIBUTING.md, "House conventions"):
//!
//! - no file under `crates/core/src/` is longer than [`MAX_LINES`] lines;
//! - the crate's top-level modules import each other without a circle: every `crate::x`
//!   path in code (comments and `#[cfg(test)]` modules aside) points to a module below the
//!   one using it. A directory module (`decision/`) counts as one module: its files are one
//!   concern split by check group.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

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
