//! The user docs' rules, part of `cargo xtask house`: the pages a user reads (the README, install, operate, the
//! runbooks, doctor and the four agents' pages) link only to files the repository has, and to headings those
//! Markdown files have; they speak of what the product does, not of the project's issue tracker, its source tree
//! or its own test layout. All of it drifted before this was a check: install.md linked to a design document outside
//! the repository and spoke of "issue 15 item 6", doctor.md listed its test files and the pairing table's source
//! file, and the examples spoke of "the seed" (the installation the project was first built for) and used its names.
//! The developer docs (architecture, development, benchmarks) may name anything.
//!
//! Fenced code blocks and inline code spans are no links; the issue rule reads everything but fenced blocks (a
//! shell comment in an example is no issue reference). The internal file rule reads everything, fenced blocks
//! included (a command in an example that names `agents/x/src/lib.rs` names it to the user too); so does the
//! "seed" rule.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The pages written for users, relative to the workspace root.
pub const USER_DOCS: &[&str] = &[
    "README.md",
    "docs/install.md",
    "docs/operate.md",
    "docs/runbooks.md",
    "docs/doctor.md",
    "docs/ca-syncer.md",
    "docs/dns-rewriter.md",
    "docs/etcd-snapshotter.md",
    "docs/kubeconfig-rotator.md",
];

/// Checks every user doc under `root`; prints each finding, and fails with their count and list.
pub fn check(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    for doc in USER_DOCS {
        let path = root.join(doc);
        let Ok(text) = std::fs::read_to_string(&path) else {
            problems.push(format!("{doc} is missing (a user doc)"));
            continue;
        };
        problems.extend(link_problems(root, doc, &text)?);
        problems.extend(wording_problems(doc, &text));
    }
    for problem in &problems {
        eprintln!("xtask: house: {problem}");
    }
    if !problems.is_empty() {
        let n = problems.len();
        bail!("{n} user doc problem{}: {}", if n == 1 { "" } else { "s" }, problems.join("; "));
    }
    Ok(())
}

/// Lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((n + 1, line)),
            _ => {}
        }
    }
    out
}

/// `line` with its inline code spans blanked (a link written in backticks is an example, not a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The targets of the Markdown links on `line`: inline `[text](target "title")` and `![alt](target)`, and
/// reference definitions `[id]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some((label, rest)) = trimmed[1..].split_once("]:")
        && !label.contains(']')
        && let Some(target) = rest.split_whitespace().next()
    {
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
    }
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        // Up to the `)` that closes the link, allowing balanced parentheses inside the target.
        let mut depth = 0usize;
        let end = after
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => return true,
                    ')' => depth -= 1,
                    _ => {}
                }
                false
            })
            .map_or(after.len(), |(i, _)| i);
        let inner = after[..end].trim();
        let target = match inner.strip_prefix('<') {
            Some(bracketed) => bracketed.split('>').next(),
            None => inner.split_whitespace().next(),
        };
        if let Some(target) = target {
            targets.push(target.to_string());
        }
        rest = &after[end..];
    }
    targets
}

/// Links in `doc` to files the repository lacks, or to headings a Markdown file lacks.
fn link_problems(root: &Path, doc: &str, text: &str) -> Result<Vec<String>> {
    let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for (n, line) in prose(text) {
        for target in link_targets(&without_code_spans(line)) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let (shown, markdown) = if file.is_empty() {
                (doc.to_string(), Some(text.to_string()))
            } else {
                let path = root.join(dir).join(file);
                if !path.exists() {
                    problems.push(format!("{doc}:{n} links to {target}, which the repository lacks"));
                    continue;
                }
                let markdown = if file.ends_with(".md") {
                    Some(std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?)
                } else {
                    None
                };
                (file.to_string(), markdown)
            };
            if let (Some(anchor), Some(markdown)) = (anchor, markdown)
                && !anchors(&markdown).contains(anchor)
            {
                problems.push(format!("{doc}:{n} links to {target}, but {shown} has no heading with that anchor"));
            }
        }
    }
    Ok(problems)
}

/// The anchors a Markdown page has, as GitHub makes them: each heading's text lower-cased, its punctuation but
/// `-` and `_` dropped, spaces turned into `-`, a repeat suffixed `-1`, `-2`, ...; plus explicit
/// `<a id="...">`/`<a name="...">` anchors.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, line) in prose(markdown) {
        for key in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(key) {
                let after = &rest[at + key.len()..];
                if let Some((id, tail)) = after.split_once('"') {
                    found.insert(id.to_string());
                    rest = tail;
                } else {
                    break;
                }
            }
        }
        let Some(heading) = line.strip_prefix('#') else { continue };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut slug = base.clone();
        let mut repeat = 0;
        while found.contains(&slug) {
            repeat += 1;
            slug = format!("{base}-{repeat}");
        }
        found.insert(slug);
    }
    found
}

/// Issue references (`issue 15`, `issues 3 and 4`, `#12`) in the prose of `doc`; internal file names and the
/// word "seed" anywhere in it.
fn wording_problems(doc: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let prose: BTreeSet<usize> = prose(text).into_iter().map(|(n, _)| n).collect();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if prose.contains(&n)
            && let Some(found) = issue_reference(line)
        {
            problems.push(format!("{doc}:{n} refers to the issue tracker ({found:?}): say what it means instead"));
        }
        for found in internal_paths(line, !prose.contains(&n)) {
            problems.push(format!(
                "{doc}:{n} names the source tree ({found:?}): say what it does, or move it to the developer docs"
            ));
        }
        if let Some(found) = seed_word(line) {
            problems.push(format!(
                "{doc}:{n} says {found:?}: name the installation or layout it means (user docs use generic names)"
            ));
        }
    }
    problems
}

/// The workspace's top-level directories that hold its crates (agents, the doctor, the tests): no user works in
/// them, whatever file they name.
const CRATE_DIRS: &[&str] = &["agents", "tools", "tests"];

/// Paths on `line` into the project's source tree: a Rust file (`*.rs`), a path into a crate directory
/// (`agents/…`, `tools/…`, `tests/…`), or a path through a `src/` or `tests/` directory. Read in code spans, link
/// targets and bare words; a whole line of a fenced block (`fenced`) is code. URLs and absolute paths (a path
/// inside a container, such as `/etc/kcp-ca`) are not the repository's. A bare word counts only when it has a `/`
/// and names a file (an extension in its last part) or a directory (a trailing `/`): a host such as `docs.rs` and
/// an "a/b" in a sentence ("the tests/benchmarks") are not paths.
fn internal_paths(line: &str, fenced: bool) -> Vec<String> {
    const DELIMITERS: &[char] = &['(', ')', '[', ']', '<', '>', '"', '\'', ',', ';', '|', '{', '}', '='];
    let mut words: Vec<(String, bool)> =
        link_targets(&without_code_spans(line)).into_iter().map(|t| (t, true)).collect();
    // Split at the backticks, every second part is a code span.
    for (i, part) in line.split('`').enumerate() {
        for word in part.split(|c: char| c.is_whitespace() || DELIMITERS.contains(&c)) {
            words.push((word.to_string(), fenced || i % 2 == 1));
        }
    }
    let mut found = Vec::new();
    for (word, code) in words {
        let word = word.split('#').next().unwrap_or_default();
        let mut path = word.trim_start_matches(['*', '_']).trim_end_matches(['.', ':', '!', '?', '*', '_']);
        while let Some(rest) = path.strip_prefix("./").or_else(|| path.strip_prefix("../")) {
            path = rest;
        }
        if path.is_empty() || path.contains("://") || path.starts_with(['/', '~', '$']) {
            continue;
        }
        let parts: Vec<&str> = path.split('/').collect();
        let last = parts[parts.len() - 1];
        if !code && (parts.len() < 2 || !(last.is_empty() || last.contains('.'))) {
            continue;
        }
        let rust_file = path.len() > ".rs".len() && path.ends_with(".rs") && (code || parts.len() > 1);
        let crate_dir = parts.len() > 1 && CRATE_DIRS.contains(&parts[0]);
        let source_dir = parts[..parts.len() - 1].iter().any(|p| matches!(*p, "src" | "tests"));
        if (rust_file || crate_dir || source_dir) && !found.iter().any(|f| f == path) {
            found.push(path.to_string());
        }
    }
    found
}

/// The first "seed" or "seeds" on `line` as a whole word, any case (`seed-layout` holds it; `seeded`,
/// `linseed` and `seed_layout` do not).
fn seed_word(line: &str) -> Option<String> {
    line.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .find(|w| w.eq_ignore_ascii_case("seed") || w.eq_ignore_ascii_case("seeds"))
        .map(str::to_string)
}

/// The first issue reference on `line`: the word `issue`/`issues` followed by a number (optionally `#`), or a
/// `#` and digits standing alone (not an anchor such as `#1-overview`, not inside a word or link target).
fn issue_reference(line: &str) -> Option<String> {
    let lower = line.to_lowercase();
    let chars: Vec<char> = lower.chars().collect();
    let word_at = |i: usize| i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let number_at = |mut i: usize| {
        let start = i;
        while chars.get(i).is_some_and(char::is_ascii_digit) {
            i += 1;
        }
        let ends_clean = chars.get(i).is_none_or(|c| !(c.is_alphanumeric() || *c == '-' || *c == '_'));
        (i > start && ends_clean).then_some(i)
    };
    for i in 0..chars.len() {
        let standalone = i == 0 || matches!(chars[i - 1], ' ' | '(' | '[' | ',' | '\t');
        if chars[i] == '#'
            && standalone
            && let Some(end) = number_at(i + 1)
        {
            return Some(chars[i..end].iter().collect());
        }
        if !word_at(i) && chars[i..].starts_with(&['i', 's', 's', 'u', 'e']) {
            let mut j = i + 5;
            if chars.get(j) == Some(&'s') {
                j += 1;
            }
            if chars.get(j) != Some(&' ') {
                continue;
            }
            j += 1;
            if chars.get(j) == Some(&'#') {
                j += 1;
            }
            if let Some(end) = number_at(j) {
                return Some(chars[i..end].iter().collect());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{anchors, check, internal_paths, issue_reference, link_targets, seed_word};
    use crate::test_tree::tree;

    /// Every user doc, each with `text` unless `files` gives its own; plus the other `files`.
    fn docs_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let mut all: Vec<(&str, &str)> =
            super::USER_DOCS.iter().filter(|d| !files.iter().any(|(p, _)| p == *d)).map(|d| (*d, "# Page\n")).collect();
        all.extend_from_slice(files);
        tree(&all)
    }

    #[test]
    fn the_repositorys_user_docs_follow_the_rules() {
        check(&crate::images::workspace_root()).unwrap();
    }

    #[test]
    fn a_link_to_a_missing_file_or_heading_fails_naming_the_line() {
        let dir = docs_with(&[
            (
                "README.md",
                "# kcp-keeper\n\nSee [install](docs/install.md), [runbook](docs/runbooks.md#kcpkeeperdown),\n\
                 [design](DESIGN.md) and [gone](docs/gone.md#x) and [here](#kcp-keeper).\n\
                 [ref]: docs/missing.md\n```sh\n[not a link](nowhere.md)\n```\n`[code](nowhere.md)`\n\
                 [web](https://example.com/x.md) [chart](charts/kcp-keeper)\n",
            ),
            ("docs/runbooks.md", "# Runbooks\n\n## KcpKeeperDown\n"),
            ("charts/kcp-keeper/values.yaml", ""),
        ]);
        let error = check(dir.path()).unwrap_err().to_string();
        assert_eq!(
            error,
            "3 user doc problems: README.md:4 links to DESIGN.md, which the repository lacks; \
             README.md:4 links to docs/gone.md#x, which the repository lacks; \
             README.md:5 links to docs/missing.md, which the repository lacks"
        );
        std::fs::write(dir.path().join("docs/operate.md"), "# Operate\n\n[alert](runbooks.md#no-such-alert)\n")
            .unwrap();
        let error = check(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("docs/operate.md:3 links to runbooks.md#no-such-alert, but runbooks.md has no heading"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_user_doc_fails() {
        let dir = docs_with(&[]);
        std::fs::remove_file(dir.path().join("docs/operate.md")).unwrap();
        assert_eq!(
            check(dir.path()).unwrap_err().to_string(),
            "1 user doc problem: docs/operate.md is missing (a user doc)"
        );
    }

    #[test]
    fn issue_references_fail_but_anchors_and_words_do_not() {
        let dir = docs_with(&[(
            "docs/install.md",
            "# Install\n\nAs issue 15 item 6 asked.\nFixed in #12.\n\
             ```sh\nkubectl scale --replicas 2  # 2 replicas (issue 3)\n```\n",
        )]);
        let error = check(dir.path()).unwrap_err().to_string();
        assert_eq!(
            error,
            "2 user doc problems: docs/install.md:3 refers to the issue tracker (\"issue 15\"): say what it means \
             instead; docs/install.md:4 refers to the issue tracker (\"#12\"): say what it means instead"
        );
        assert_eq!(issue_reference("see Issues #4 and 5").as_deref(), Some("issues #4"));
        assert_eq!(issue_reference("(#7)").as_deref(), Some("#7"));
        for fine in [
            "[Overview](#1-overview)",
            "runbooks.md#kcpkeeperdown",
            "an issue with 3 shards",
            "reissue 5 certificates",
            "color #fff",
            "tissue 4",
            "page#3",
        ] {
            assert_eq!(issue_reference(fine), None, "{fine}");
        }
    }

    #[test]
    fn internal_file_names_fail_but_user_facing_paths_do_not() {
        let dir = docs_with(&[
            (
                "docs/doctor.md",
                "# Doctor\n\nWith this table in `src/rules/pairing.rs`:\n\
                 A test proves it ([rbac](../tests/chart/tests/rbac.rs)).\n\
                 See tools/kcp-keeper/tests/objects.rs.\n\
                 ```sh\ndns-rewriter rbac --config agents/dns-rewriter/example.yaml\n```\n\
                 Set [`values.yaml`](../charts/kcp-keeper/values.yaml) as in `charts/kcp-keeper/README.md`, mount\n\
                 `/etc/kcp-ca/ca.crt`, read `kube-system/kube-dns` and [the runbook](runbooks.md#doctor-read);\n\
                 unit tests and src code, docs.rs, `kcp_keeper_runtime::config`.\n",
            ),
            ("docs/runbooks.md", "# Runbooks\n\n## doctor: read\n"),
            ("tests/chart/tests/rbac.rs", ""),
            ("charts/kcp-keeper/values.yaml", ""),
        ]);
        let error = check(dir.path()).unwrap_err().to_string();
        let says = |n: usize, path: &str| {
            format!(
                "docs/doctor.md:{n} names the source tree (\"{path}\"): say what it does, or move it to the developer docs"
            )
        };
        assert_eq!(
            error,
            format!(
                "4 user doc problems: {}; {}; {}; {}",
                says(3, "src/rules/pairing.rs"),
                says(4, "tests/chart/tests/rbac.rs"),
                says(5, "tools/kcp-keeper/tests/objects.rs"),
                says(7, "agents/dns-rewriter/example.yaml")
            )
        );
        assert_eq!(internal_paths("`lib.rs` and lib.rs", false), ["lib.rs"]);
        assert_eq!(internal_paths("kcp.rs", true), ["kcp.rs"]);
        assert_eq!(internal_paths("the chart's tests/chart/ directory", false), ["tests/chart/"]);
        assert_eq!(
            internal_paths("see **agents/ca-syncer/src/config.rs**.", false),
            ["agents/ca-syncer/src/config.rs"]
        );
        assert_eq!(
            internal_paths("[x](./charts/kcp-keeper/tests/a.yaml#top)", false),
            ["charts/kcp-keeper/tests/a.yaml"]
        );
        for fine in [
            "[install](install.md) and [chart](../charts/kcp-keeper)",
            "`images/<agent>/Dockerfile`, `files/dashboard.json`, `charts/kcp-keeper/rules/doctor.rules.yaml`",
            "`/usr/src/app/tests/x.rs` in the image, `~/src/kcp`, `$HOME/tests/`",
            "https://github.com/kcp-dev/kcp/blob/main/src/tests/x.rs and docs.rs",
            "`docs/runbooks.md#doctor-<check>`, `kcp-system/root-server-ca`, `configmap:my-app/oidc`",
            "the tests/benchmarks",
        ] {
            assert_eq!(internal_paths(fine, false), Vec::<String>::new(), "{fine}");
        }
    }

    #[test]
    fn the_word_seed_fails_anywhere_but_not_inside_other_words() {
        let dir = docs_with(&[(
            "docs/runbooks.md",
            "# Runbooks\n\nConfigured unlike the Seed.\n```yaml\nnamespace: seeds # the seed-layout\n```\n\
             Seeded, seeding, linseed, seedling and seed_layout are other words.\n",
        )]);
        let error = check(dir.path()).unwrap_err().to_string();
        assert_eq!(
            error,
            "2 user doc problems: docs/runbooks.md:3 says \"Seed\": name the installation or layout it means (user \
             docs use generic names); docs/runbooks.md:5 says \"seeds\": name the installation or layout it means \
             (user docs use generic names)"
        );
        assert_eq!(seed_word("a seed-layout lock").as_deref(), Some("seed"));
        assert_eq!(seed_word("SEEDS:").as_deref(), Some("SEEDS"));
        for fine in ["seeded", "reseed", "seed_layout", "seedling", "linseed", "s e e d"] {
            assert_eq!(seed_word(fine), None, "{fine}");
        }
    }

    #[test]
    fn links_and_anchors_are_read_as_markdown_and_github_make_them() {
        assert_eq!(
            link_targets("a [x](a.md) ![i](img/p.png \"t\") [y](<b c.md>) [f](x_(1).md#h)"),
            ["a.md", "img/p.png", "b c.md", "x_(1).md#h"]
        );
        assert_eq!(link_targets("[id]: docs/x.md \"title\""), ["docs/x.md"]);
        let found = anchors("# Quick start\n## What `doctor` checks (v2)\n## Quick start\n<a id=\"custom\"></a>\n");
        let found: Vec<_> = found.iter().map(String::as_str).collect();
        assert_eq!(found, ["custom", "quick-start", "quick-start-1", "what-doctor-checks-v2"]);
    }
}
