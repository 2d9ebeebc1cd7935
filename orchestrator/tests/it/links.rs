//! Every relative link and `#anchor` in README.md and docs/ resolves, so a
//! section renamed or deleted cannot leave links pointing at nothing.
//!
//! Anchors follow GitHub's rule for headings: lower case, spaces become
//! `-`, every other character but letters, digits, `-` and `_` dropped,
//! and a repeated heading gets `-1`, `-2`, ... Code blocks are skipped
//! (neither their `#` lines nor their brackets are headings or links);
//! `<a id="...">` and `<a name="...">` also make anchors.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

tests! {
    sync every_link_in_the_readme_and_docs_resolves,
    sync a_dead_anchor_or_file_is_found,
    sync anchors_follow_githubs_rules,
}

/// The repository's root (the orchestrator crate's parent).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the orchestrator crate sits in the workspace")
        .to_path_buf()
}

/// README.md and every Markdown file under docs/, sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    found.retain(|p| p.is_file());
    found.sort();
    found
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fenced = false;
    text.lines().enumerate().filter_map(move |(i, line)| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return None;
        }
        (!fenced).then_some((i + 1, line))
    })
}

/// GitHub's anchor for a heading's text.
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

/// Every anchor a Markdown document defines.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim().trim_end_matches('#'));
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for key in ["<a id=\"", "<a name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(key) {
                rest = &rest[at + key.len()..];
                if let Some(end) = rest.find('"') {
                    out.insert(rest[..end].to_string());
                }
            }
        }
    }
    out
}

/// The targets of the inline links `[text](target)` on one line.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        if !target.is_empty() {
            targets.push(target.to_string());
        }
        rest = &rest[end..];
    }
    targets
}

/// Every dead link in `docs`, as `file:line: target (why)`.
fn dead_links(root: &Path, docs: &[PathBuf]) -> Vec<String> {
    let mut dead = Vec::new();
    let mut cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for doc in docs {
        let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let shown = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
        for (number, line) in prose(&text) {
            for target in link_targets(line) {
                // Absolute URLs (https:, mailto:) are not this test's.
                if target.split_once(':').is_some_and(|(scheme, _)| {
                    !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphabetic())
                }) {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().unwrap_or(root).join(path)
                };
                if !dest.exists() {
                    dead.push(format!("{shown}:{number}: {target} (no such file)"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if dest.extension().is_none_or(|e| e != "md") {
                    continue;
                }
                let known = cache.entry(dest.clone()).or_insert_with(|| {
                    fs::read_to_string(&dest)
                        .map(|t| anchors(&t))
                        .unwrap_or_default()
                });
                if !known.contains(anchor) {
                    dead.push(format!("{shown}:{number}: {target} (no such anchor)"));
                }
            }
        }
    }
    dead
}

fn every_link_in_the_readme_and_docs_resolves() {
    let root = root();
    let docs = documents(&root);
    assert!(
        docs.iter().any(|d| d.ends_with("README.md")),
        "README.md not found under {}",
        root.display()
    );
    let dead = dead_links(&root, &docs);
    assert!(
        dead.is_empty(),
        "dead links in README.md or docs/:\n{}",
        dead.join("\n")
    );
}

fn a_dead_anchor_or_file_is_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::create_dir(dir.path().join("docs")).expect("docs/");
    fs::write(
        dir.path().join("README.md"),
        "# Title\n\n## Set up\n\nSee [set up](#set-up), [gone](#deleted-section),\n\
         [guide](docs/guide.md#deploy), [old](docs/guide.md#kubernetes),\n\
         [missing](docs/nothing.md) and [web](https://example.invalid/x#y).\n\
         ```\n[not a link](#inside-code)\n```\n",
    )
    .expect("README");
    fs::write(
        dir.path().join("docs/guide.md"),
        "# Guide\n\n## Deploy\n\nBack to [the top](../README.md#title).\n",
    )
    .expect("guide");
    let docs = documents(dir.path());
    assert_eq!(docs.len(), 2, "{docs:?}");
    let dead = dead_links(dir.path(), &docs);
    assert_eq!(
        dead,
        [
            "README.md:5: #deleted-section (no such anchor)",
            "README.md:6: docs/guide.md#kubernetes (no such anchor)",
            "README.md:7: docs/nothing.md (no such file)",
        ],
    );
}

fn anchors_follow_githubs_rules() {
    let text = "# Set up\n## `tailmesh run` and --check\n## Set up\n\
                ### Why pull's tail is worse (1 %)\n<a id=\"kept\"></a>\n\
                ```\n# not a heading\n```\n#NotAHeading\n";
    let found: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(
        found,
        [
            "kept",
            "set-up",
            "set-up-1",
            "tailmesh-run-and---check",
            "why-pulls-tail-is-worse-1-",
        ]
    );
}
