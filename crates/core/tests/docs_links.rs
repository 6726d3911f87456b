//! The documentation's links resolve, and the README stays a front door.
//!
//! Scans `README.md`, `CONTRIBUTING.md` and `docs/*.md` at the repository root. Every
//! relative markdown link `[text](path)`, `[text](path#anchor)` and `[text](#anchor)` must
//! name a file or directory that exists (relative to the linking document's directory) and,
//! for an anchor into a `.md` file, a heading whose GitHub slug is that anchor. Links in
//! fenced code blocks and code spans are not links; `scheme://` and `mailto:` targets are
//! left to their sites. Std only: a link checker needs no markdown parser for the subset
//! these documents use (ATX headings, inline links).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The README's length limit, in lines: the front door says what it is, the first two
/// commands, how it works, deploy in short and where to read next; the rest lives in
/// `docs/` (README.md, "Where to read next").
const README_MAX_LINES: usize = 400;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The documents whose links are checked: `README.md`, `CONTRIBUTING.md`, `docs/*.md`,
/// sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut in_docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// `text` without its code spans (a run of n backticks up to the next run of exactly n).
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        // Find the closing run of exactly `run` backticks.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let n = chars[j..].iter().take_while(|&&c| c == '`').count();
                if n == run {
                    close = Some(j + n);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => i = end,
            None => {
                // An unclosed run is literal text.
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The lines of `text` outside fenced code blocks (``` or ~~~, indented or not), with
/// their 1-based line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = if t.starts_with("```") {
            Some("```")
        } else if t.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((n + 1, line)),
            _ => {}
        }
    }
    out
}

/// GitHub's anchor for a heading: lowercase, spaces become `-`, every other character
/// but letters, digits, `-` and `_` is dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown document: its ATX headings' slugs, a repeated slug
/// numbered `-1`, `-2`, ... as GitHub does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The inline link targets of one line of prose (code spans removed), in order.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(k) = rest.find("](") {
        let after = &rest[k + 2..];
        let mut depth = 1;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        // A link may carry a title after the destination: `(path "title")`.
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(['<', '>']).to_owned());
        rest = &after[end + 1..];
    }
    out
}

/// Every broken link of the document `doc` (its text `text`), as `name:line: reason`.
/// Targets are resolved against `doc`'s directory; anchors into other `.md` files read
/// that file from disk.
fn broken_links(root: &Path, doc: &Path, text: &str) -> Vec<String> {
    let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
    let own = anchors(text);
    let dir = doc.parent().expect("a document has a directory");
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        for target in link_targets(line) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            if path.is_empty() {
                if let Some(a) = anchor
                    && !own.contains(a)
                {
                    out.push(format!("{name}:{n}: #{a}: no such heading in this file"));
                }
                continue;
            }
            let file = dir.join(path);
            if !file.exists() {
                out.push(format!("{name}:{n}: {target}: {path} does not exist"));
                continue;
            }
            if let Some(a) = anchor
                && file.extension().is_some_and(|e| e == "md")
            {
                let theirs = anchors(&fs::read_to_string(&file).unwrap_or_default());
                if !theirs.contains(a) {
                    out.push(format!("{name}:{n}: {target}: no heading #{a} in {path}"));
                }
            }
        }
    }
    out
}

#[test]
fn every_docs_link_resolves() {
    let root = repo_root();
    let docs = documents(&root);
    assert!(
        docs.iter().any(|d| d.ends_with("docs/ARCHITECTURE.md")),
        "the scan sees docs/: {docs:?}"
    );
    let mut links = 0;
    let mut broken = Vec::new();
    for doc in &docs {
        let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        links += prose_lines(&text)
            .iter()
            .map(|(_, l)| link_targets(l).len())
            .sum::<usize>();
        broken.extend(broken_links(&root, doc, &text));
    }
    assert!(links > 50, "only {links} links found: the scan is broken");
    assert!(
        broken.is_empty(),
        "links that do not resolve:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_check_reports_a_broken_link_and_a_broken_anchor() {
    let root = repo_root();
    let doc = root.join("README.md");
    let text = "\
# Made up

## A heading: with `code`, punctuation (and more)

[fine](docs/ARCHITECTURE.md#principles) and [fine too](#a-heading-with-code-punctuation-and-more)
and [a directory](docs) and [outside](https://example.com/x#y)
[gone](docs/NO_SUCH_GUIDE.md) and [no anchor](docs/ARCHITECTURE.md#no-such-heading)
[nowhere](#nowhere) and `[in code](docs/NOT_A_LINK.md)`

```
[in a fence](docs/NOT_A_LINK_EITHER.md)
```
";
    let broken = broken_links(&root, &doc, text);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(
        broken[0].contains("NO_SUCH_GUIDE.md does not exist"),
        "{broken:#?}"
    );
    assert!(
        broken[1].contains("no heading #no-such-heading in docs/ARCHITECTURE.md"),
        "{broken:#?}"
    );
    assert!(
        broken[2].contains("#nowhere: no such heading"),
        "{broken:#?}"
    );
    assert!(
        broken
            .iter()
            .all(|b| b.starts_with("README.md:7:") || b.starts_with("README.md:8:"))
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Executors that never connect: `executor_never_connects`, `preflight`"),
        "executors-that-never-connect-executor_never_connects-preflight"
    );
    assert_eq!(
        slug("Connection-level (SNI) filtering: not deployed, and why"),
        "connection-level-sni-filtering-not-deployed-and-why"
    );
    assert_eq!(
        slug("The `make bench` table of 2026-12-02"),
        "the-make-bench-table-of-2026-12-02"
    );
    let twice = anchors("## Settings\n\n### Settings\n\n```\n# not a heading\n```\n");
    assert_eq!(
        twice,
        ["settings", "settings-1"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

#[test]
fn readme_is_a_front_door() {
    let text = fs::read_to_string(repo_root().join("README.md")).expect("README.md exists");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to docs/"
    );
}
