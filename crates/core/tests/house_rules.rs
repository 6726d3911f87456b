//! The house rules of the workspace that a compiler does not check (docs/ARCHITECTURE.md,
//! "Module layers"; CONTRIBUTING.md, "House conventions"):
//!
//! - no source file is over its limit (`no_source_file_over_its_limit`): 700 lines in
//!   `sandbox-core` and `sandbox-controller`, 1,000 in every other crate; tests, test
//!   support (the `testkit` crate, the test suites' own crates under `tests/`, the
//!   controller's `test-support` modules) and a file's `#[cfg(test)]` tail are excepted;
//! - no crate's top-level modules import each other in a circle
//!   (`no_import_circle_in_any_crate`): every `crate::x` path in code (comments and
//!   `#[cfg(test)]` modules aside) points to a module below the one using it. A directory
//!   module (`decision/`) counts as one module: its files are one concern split by check
//!   group. Binaries under `src/bin/` are crates of their own;
//! - the design is cited, not the history (`no_issue_numbers_in_code_or_docs`): no tracked
//!   source, document or template names an issue by number;
//! - every citation of the design in the repository's tracked files resolves
//!   (`every_design_citation_resolves`): `docs/ARCHITECTURE.md principle N` and a bare
//!   `principle N` name a principle that exists there, a section citation such as
//!   `docs/ARCHITECTURE.md, "Module layers"` names one of its headings, and nothing cites the design document that is not in the
//!   repository (the design sketch this replaced).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The longest a source file of `sandbox-core` or `sandbox-controller` may be, lines.
const MAX_LINES_CORE: usize = 700;
/// The longest any other crate's source file may be, lines.
const MAX_LINES_OTHER: usize = 1_000;

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

/// The top-level module of `src` a file belongs to (`decision/idle.rs` → `decision`),
/// `None` for the crate root (`lib.rs`, `main.rs`) and for binaries (`src/bin/`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("file under src");
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main" && name != "bin").then_some(name)
}

/// The lines of `text` that are code outside unit tests: everything before the first
/// `#[cfg(test)]` line.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
}

/// The modules `text` names as `crate::<module>` in code: comment lines and everything
/// from the first `#[cfg(test)]` on are skipped (unit tests may reach anywhere).
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code_lines(text) {
        let code = line.trim_start();
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

/// The import graph of the top-level modules under `src`: module → modules it imports.
fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(src);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for f in &files {
        let Some(m) = module_of(src, f) else { continue };
        let text = fs::read_to_string(f).expect("read source");
        for target in imports(&text) {
            if target != m && modules.contains(&target) {
                graph.get_mut(&m).expect("known module").insert(target);
            }
        }
    }
    graph
}

/// Every crate's `src` directory in the workspace: `crates/*/src` and `tests/*/src`.
fn crate_src_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for group in ["crates", "tests"] {
        let Ok(entries) = fs::read_dir(root.join(group)) else {
            continue;
        };
        for entry in entries {
            let src = entry.expect("directory entry").path().join("src");
            if src.is_dir() {
                out.push(src);
            }
        }
    }
    out.sort();
    out
}

/// The circles of every crate under `root`, one line each (`crate: a -> b -> a`).
fn circles_under(root: &Path) -> Vec<String> {
    crate_src_dirs(root)
        .iter()
        .filter_map(|src| {
            let name = src.parent()?.file_name()?.to_string_lossy().into_owned();
            find_circle(&import_graph(src)).map(|c| format!("{name}: {}", c.join(" -> ")))
        })
        .collect()
}

/// Whether `file` (under `root`) is test support or a test, which have no line limit: the
/// `testkit` crate, the crates under `tests/`, `tests/` and `benches/` directories, and the
/// controller's `test-support` modules (`contract.rs`, `doubles.rs`).
fn is_test_support(root: &Path, file: &Path) -> bool {
    let rel = file.strip_prefix(root).unwrap_or(file);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.first().is_some_and(|p| p == "tests")
        || parts.get(1).is_some_and(|p| p == "testkit")
        || parts.iter().any(|p| p == "tests" || p == "benches")
        || (parts.get(1).is_some_and(|p| p == "controller")
            && parts
                .last()
                .is_some_and(|f| f == "contract.rs" || f == "doubles.rs"))
}

/// The line limit of a source file under `root`: [`MAX_LINES_CORE`] in `crates/core` and
/// `crates/controller`, else [`MAX_LINES_OTHER`].
fn line_limit(root: &Path, file: &Path) -> usize {
    let rel = file.strip_prefix(root).unwrap_or(file);
    if rel.starts_with("crates/core") || rel.starts_with("crates/controller") {
        MAX_LINES_CORE
    } else {
        MAX_LINES_OTHER
    }
}

/// Every non-test source file under `root`'s crates over its limit, counting the lines
/// before its `#[cfg(test)]` tail.
fn files_over_their_limit(root: &Path) -> Vec<String> {
    crate_src_dirs(root)
        .iter()
        .flat_map(|src| rust_files(src))
        .filter(|f| !is_test_support(root, f))
        .filter_map(|f| {
            let text = fs::read_to_string(&f).expect("read source");
            let n = code_lines(&text).count();
            let limit = line_limit(root, &f);
            (n > limit).then(|| {
                format!(
                    "{}: {n} lines (limit {limit})",
                    f.strip_prefix(root).unwrap_or(&f).display()
                )
            })
        })
        .collect()
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
fn no_source_file_over_its_limit() {
    let long = files_over_their_limit(&repo_root());
    assert!(
        long.is_empty(),
        "source files over their limit (split them by concern): {long:#?}"
    );
}

#[test]
fn no_import_circle_in_any_crate() {
    let root = repo_root();
    // The check must see the layers it guards: the core's decision imports the types it
    // returns, and every crate of the workspace is scanned.
    let core = import_graph(&src_dir());
    assert!(
        core["decision"].contains("outcome") && core["record"].contains("evidence"),
        "the import scan found no edges: {core:#?}"
    );
    assert!(
        crate_src_dirs(&root).len() >= 10,
        "the crates were not found"
    );
    let circles = circles_under(&root);
    assert!(
        circles.is_empty(),
        "import circles (a module may import only modules below it): {circles:#?}"
    );
}

/// A throwaway workspace under the target directory with `files` (path → text).
fn scratch_workspace(name: &str, files: &[(&str, String)]) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("house-rules-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    for (path, text) in files {
        let p = root.join(path);
        fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }
    root
}

#[test]
fn the_whole_workspace_checks_can_fail() {
    let long = "// line\n".repeat(MAX_LINES_CORE + 1);
    let medium = "// line\n".repeat(MAX_LINES_OTHER - 1);
    let root = scratch_workspace(
        "self-test",
        &[
            ("crates/core/src/lib.rs", "pub mod a;\n".to_owned()),
            ("crates/core/src/big.rs", long.clone()),
            ("crates/local/src/fine.rs", medium),
            ("crates/local/src/huge.rs", long.repeat(2)),
            (
                "crates/local/src/tested.rs",
                format!(
                    "// code\n#[cfg(test)]\nmod tests {{\n{}}}\n",
                    long.repeat(2)
                ),
            ),
            ("crates/testkit/src/sim.rs", long.repeat(3)),
            ("crates/controller/src/contract.rs", long.repeat(3)),
            ("crates/aws/src/a.rs", "use crate::b::B;\n".to_owned()),
            (
                "crates/aws/src/b/mod.rs",
                "// use crate::a::A; a comment is no import\nuse crate::c::C;\n".to_owned(),
            ),
            (
                "crates/aws/src/c.rs",
                "pub(crate) use crate::a::A;\n".to_owned(),
            ),
            (
                "crates/aws/src/bin/tool.rs",
                "use crate::a::A;\n".to_owned(),
            ),
            (
                "crates/cli/src/x.rs",
                "use crate::y::Y;\n#[cfg(test)]\nmod tests { use crate::y::Z; }\n".to_owned(),
            ),
            (
                "crates/cli/src/y.rs",
                "#[cfg(test)]\nmod tests { use crate::x::X; }\n".to_owned(),
            ),
        ],
    );
    assert_eq!(
        files_over_their_limit(&root),
        vec![
            format!(
                "crates/core/src/big.rs: {} lines (limit 700)",
                MAX_LINES_CORE + 1
            ),
            format!(
                "crates/local/src/huge.rs: {} lines (limit 1000)",
                2 * (MAX_LINES_CORE + 1)
            ),
        ]
    );
    assert_eq!(
        circles_under(&root),
        vec!["aws: a -> b -> c -> a".to_owned()]
    );
    let _ = fs::remove_dir_all(&root);
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
        "rs", "md", "toml", "py", "ts", "yaml", "yml", "sh", "mk", "json", "txt", "mjs",
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

// --- The design is cited, not the history. ---

/// Every place `text` names an issue by number (the word, singular or plural, then a
/// number, optionally after `#`), case-insensitively, as `line: the words`.
fn issue_numbers(text: &str) -> Vec<String> {
    let word = ["iss", "ue"].concat();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        let mut from = 0;
        while let Some(i) = lower[from..].find(&word) {
            let at = from + i;
            from = at + word.len();
            let before = lower[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                continue;
            }
            let rest = lower[from..].strip_prefix('s').unwrap_or(&lower[from..]);
            let spaced = rest.trim_start_matches([' ', '\t']);
            if spaced.len() == rest.len() && !rest.starts_with('#') {
                continue;
            }
            let number = spaced.trim_start_matches('#');
            if number.starts_with(|c: char| c.is_ascii_digit()) {
                let end = (from + 12).min(line.len());
                out.push(format!(
                    "{}: {}",
                    n + 1,
                    line.get(at..end).unwrap_or(line).trim()
                ));
            }
        }
    }
    out
}

#[test]
fn no_issue_numbers_in_code_or_docs() {
    let root = repo_root();
    let mut found = Vec::new();
    for file in repository_text_files() {
        let rel = file.strip_prefix(&root).unwrap_or(&file).to_path_buf();
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        for hit in issue_numbers(&text) {
            found.push(format!("{}:{hit}", rel.display()));
        }
    }
    assert!(
        found.is_empty(),
        "{} citations of issue numbers (cite the design in docs/ instead, or drop the history): {found:#?}",
        found.len()
    );
}

#[test]
fn the_issue_number_check_finds_them() {
    let word = ["Iss", "ue"].concat();
    let text = format!(
        "// {word} 26: the split.\n/// See {word}s 26 and 27.\n# ({} #27)\nfine: tissue 5, {word}-free, aws/containers-roadmap#1917, {word}s and pull requests\n",
        word.to_lowercase()
    );
    let hits = issue_numbers(&text);
    assert_eq!(hits.len(), 3, "{hits:#?}");
    assert!(hits[0].starts_with("1: ") && hits[1].starts_with("2: ") && hits[2].starts_with("3: "));
}
