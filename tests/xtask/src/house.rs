//! `cargo xtask house`: the house rules of the product code that the compiler does not enforce, checked by
//! `cargo xtask test` right after the format and before clippy. The product crates are the workspace members
//! under `agents/` and `tools/`.
//!
//! - **No import circles.** No two modules of a crate import each other, directly or around a longer ring
//!   (docs/architecture.md). Modules in a circle can only be read, tested, changed or moved together, and a
//!   circle grows: the next import between its members is free. The rule lived in reviews, and the first new
//!   circle landed hours after the last one was fixed; so it is a check that names what ties each circle.
//! - **Role files.** Every agent has the same files for the same roles (docs/architecture.md, "The same files in
//!   every agent"), so whoever knows one agent finds their way in the others, and its `main.rs` only hands over
//!   to the runtime.
//! - **One way to declare a metric.** Every series of an agent or tool is declared with
//!   `kcp_keeper_runtime::metrics!` (one line per series: name, help, unit, type); only the runtime registers
//!   series on a `Registry` by hand. A `.register("name", ...)` or `.register_with_unit("name", ...)` elsewhere in
//!   product code (test modules aside) fails.
//!
//! The module graph is read from the source text, not from the compiler: after comments and literals are
//! dropped, every `crate::...` and `super::...` path, in `use` trees and in code, is an edge from its file to the
//! file of the longest module prefix it names (`crate::storage::Store::new` is `src/storage.rs`, or
//! `src/storage/mod.rs`; the crate root is lib.rs, else main.rs). A module imported whole (`use crate::storage;`)
//! is followed where the file uses it (`storage::Store`). Test code (items under `#[cfg(test)]`, and the files of
//! `#[cfg(test)] mod x;`) may import anything. `mod child;` is not an edge, and neither is a parent's path
//! relative to its own child (`child::f()`): a part taking its parent's shared items (`super::Entry`) while the
//! parent calls into its parts is the tree itself, not a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The files every agent has, with the role each holds (docs/architecture.md).
const ROLE_FILES: &[(&str, &str)] = &[
    ("main.rs", "`cli::main::<Agent>()`"),
    ("lib.rs", "the crate map and `impl Agent`"),
    ("config.rs", "the raw and validated configuration"),
    ("error.rs", "the daemon's error enums"),
    ("scope.rs", "the plan the watches or the Lease come from"),
    ("scope/rbac.rs", "the Roles from the same plan"),
    ("metrics.rs", "the agent's metrics"),
    ("cli.rs", "the one-shots"),
];
/// The daemon's work, one of them: the driver's `Reconciler` or the schedules.
const WORK_FILES: [&str; 2] = ["reconcile.rs", "schedule.rs"];
/// An agent's `main.rs` hands over to `kcp_keeper_runtime::cli::main::<Agent>()` and tests its command line;
/// anything longer is agent code that belongs in the library, where the tests and the other agents' readers are.
const MAIN_MAX_LINES: usize = 15;

/// The attribute every product crate's root carries: clippy (run with `-D warnings`) then refuses a function of
/// more than 100 lines of code, its default threshold, in that crate's library and unit tests. Integration tests
/// and benches are other crates, left out.
const LONG_FUNCTIONS: &str = "#![warn(clippy::too_many_lines)]";

/// Checks every product crate of the workspace at `root`; prints each finding, and fails with their summary.
pub fn check(root: &Path) -> Result<()> {
    let crates = product_crates(root)?;
    let mut circles = Vec::new();
    let mut problems = Vec::new();
    let mut by_hand = Vec::new();
    let mut unlinted = Vec::new();
    for dir in &crates {
        circles.extend(circles_in(root, dir)?);
        if dir.starts_with("agents/") && dir != "agents/runtime" {
            problems.extend(role_problems(root, dir));
        }
        if dir != "agents/runtime" {
            by_hand.extend(metric_problems(root, dir)?);
        }
        unlinted.extend(lint_problem(root, dir));
    }
    for circle in &circles {
        eprintln!("{circle}");
    }
    for problem in problems.iter().chain(&by_hand).chain(&unlinted) {
        eprintln!("xtask: house: {problem}");
    }
    let mut failures = Vec::new();
    if !circles.is_empty() {
        let each: Vec<String> = circles.iter().map(|c| format!("{}: {}", c.src, c.files.join(", "))).collect();
        failures.push(format!("{} in product code: {}", count(circles.len(), "import circle"), each.join("; ")));
    }
    if !problems.is_empty() {
        failures.push(format!("{}: {}", count(problems.len(), "role file problem"), problems.join("; ")));
    }
    if !by_hand.is_empty() {
        failures.push(format!("{}: {}", count(by_hand.len(), "series registered by hand"), by_hand.join("; ")));
    }
    if !unlinted.is_empty() {
        failures.push(format!("{} without the length lint: {}", count(unlinted.len(), "crate"), unlinted.join("; ")));
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// The workspace members under `agents/` and `tools/`, from the root Cargo.toml's `members = [...]`.
fn product_crates(root: &Path) -> Result<Vec<String>> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).context("reading the workspace's Cargo.toml")?;
    let members = manifest
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .context("no `members = [...]` in the workspace's Cargo.toml")?;
    Ok(members
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|m| m.starts_with("agents/") || m.starts_with("tools/"))
        .map(String::from)
        .collect())
}

/// What an agent at `dir` lacks of its role files, or a `main.rs` grown past [`MAIN_MAX_LINES`].
fn role_problems(root: &Path, dir: &str) -> Vec<String> {
    let src = root.join(dir).join("src");
    let mut problems: Vec<String> = ROLE_FILES
        .iter()
        .filter(|(file, _)| !src.join(file).is_file())
        .map(|(file, role)| format!("{dir}/src/{file} is missing ({role})"))
        .collect();
    if !WORK_FILES.iter().any(|file| src.join(file).is_file()) {
        problems.push(format!("{dir}/src has neither reconcile.rs nor schedule.rs (the daemon's work)"));
    }
    if let Ok(main) = std::fs::read_to_string(src.join("main.rs")) {
        let lines = main.lines().count();
        if lines > MAIN_MAX_LINES {
            problems.push(format!(
                "{dir}/src/main.rs has {lines} lines, at most {MAIN_MAX_LINES}: it only calls `cli::main::<Agent>()`"
            ));
        }
    }
    problems
}

/// The crate at `dir` when its root (`src/lib.rs`, else `src/main.rs`) lacks [`LONG_FUNCTIONS`] as a line.
fn lint_problem(root: &Path, dir: &str) -> Option<String> {
    let src = root.join(dir).join("src");
    let file = if src.join("lib.rs").is_file() { "lib.rs" } else { "main.rs" };
    let text = std::fs::read_to_string(src.join(file)).unwrap_or_default();
    (!text.lines().any(|l| l.trim() == LONG_FUNCTIONS))
        .then(|| format!("{dir}/src/{file} lacks `{LONG_FUNCTIONS}`: a function stays within 100 lines of code"))
}

/// Series registered by hand in the crate at `dir` (outside its test code), instead of with `metrics!`: a call
/// `.register("…"` or `.register_with_unit("…"` among the tokens of product code (comments, strings and
/// `#[cfg(test)]` items, including `#[cfg(test)] mod x;` files, left out), each named by file and line.
fn metric_problems(root: &Path, dir: &str) -> Result<Vec<String>> {
    let src = root.join(dir).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths)?;
    paths.sort();
    let mut product = Vec::new();
    let mut test_modules = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let (kept, tests) = without_test_items(tokens(&text));
        test_modules.extend(tests);
        product.push((path, text, kept));
    }
    let mut problems = Vec::new();
    for (path, text, kept) in product {
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let in_test_module = test_modules.contains(&stem)
            || (stem == "mod"
                && path
                    .parent()
                    .and_then(|p| p.file_name())
                    .is_some_and(|d| test_modules.iter().any(|m| d == m.as_str())));
        let by_hand = kept.windows(4).any(|w| {
            w[0] == "." && (w[1] == "register" || w[1] == "register_with_unit") && w[2] == "(" && w[3] == "\"\""
        });
        if in_test_module || !by_hand {
            continue;
        }
        // Where: the lines that make such a call, for the reader.
        let file = path.strip_prefix(root).unwrap_or(&path).display().to_string();
        for (n, line) in text.lines().enumerate() {
            if line.contains(".register(\"") || line.contains(".register_with_unit(\"") {
                problems.push(format!(
                    "{file}:{} registers a series by hand: declare it with kcp_keeper_runtime::metrics!",
                    n + 1
                ));
            }
        }
    }
    Ok(problems)
}

/// Modules of one crate that import each other, with what ties them.
#[derive(Debug)]
struct Circle {
    /// The crate's `src` directory, relative to the workspace.
    src: String,
    /// Its files, relative to `src`.
    files: Vec<String>,
    /// Every edge between them: `(from, to, names taken)`.
    edges: Vec<(String, String, Vec<String>)>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "xtask: house: import circle in {} ({} files): {}",
            self.src,
            self.files.len(),
            self.files.join(", ")
        )?;
        for (from, to, names) in &self.edges {
            write!(f, "\n    {from} -> {to}: {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// The import circles of the crate at `root/dir`: the strongly connected components of its module graph that
/// hold more than one file.
fn circles_in(root: &Path, dir: &str) -> Result<Vec<Circle>> {
    let (files, edges) = graph(&root.join(dir).join("src"))?;
    let mut circles = Vec::new();
    for mut component in strongly_connected(&edges) {
        component.sort();
        let mut circle = Circle { src: format!("{dir}/src"), files: Vec::new(), edges: Vec::new() };
        for &from in &component {
            circle.files.push(files[from].clone());
            for (to, names) in edges[from].iter().filter(|(to, _)| component.contains(to)) {
                circle.edges.push((files[from].clone(), files[*to].clone(), names.iter().cloned().collect()));
            }
        }
        circles.push(circle);
    }
    circles.sort_by(|a, b| a.files.cmp(&b.files));
    Ok(circles)
}

/// For each file of one crate (relative to `src`), the files it imports from and the names it takes.
type Edges = Vec<BTreeMap<usize, BTreeSet<String>>>;

/// The module graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> Result<(Vec<String>, Edges)> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths)?;
    paths.sort_by_key(|p| p.to_string_lossy().into_owned());
    let root_file = if src.join("lib.rs").is_file() { "lib.rs" } else { "main.rs" };
    // Each file's module path and tokens; a binary's main.rs beside lib.rs is another crate.
    let mut parsed = Vec::new();
    let mut test_modules = Vec::new();
    for path in paths {
        let relative = path.strip_prefix(src)?.to_string_lossy().replace('\\', "/");
        let module = match relative.as_str() {
            "lib.rs" | "main.rs" if relative != root_file => continue,
            _ if relative.starts_with("bin/") => continue,
            "lib.rs" | "main.rs" => Vec::new(),
            _ => {
                let stem = relative.trim_end_matches(".rs").trim_end_matches("/mod");
                stem.split('/').map(String::from).collect()
            }
        };
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let (tokens, test_children) = without_test_items(tokens(&text));
        test_modules.extend(test_children.into_iter().map(|child| [module.clone(), vec![child]].concat()));
        parsed.push((relative, module, tokens));
    }
    parsed.retain(|(_, module, _)| !test_modules.iter().any(|t| module.starts_with(t)));
    let modules: BTreeMap<&[String], usize> = parsed.iter().enumerate().map(|(i, p)| (&p.1[..], i)).collect();
    let mut edges: Edges = vec![BTreeMap::new(); parsed.len()];
    for (from, (_, module, tokens)) in parsed.iter().enumerate() {
        for (to, name) in imports(tokens, module, &modules) {
            if to != from {
                edges[from].entry(to).or_default().insert(name);
            }
        }
    }
    Ok((parsed.into_iter().map(|p| p.0).collect(), edges))
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// What a file in `module` takes from other modules: `(file index, name)` for every `crate::`/`super::` path,
/// and for every use of a module it imported whole.
fn imports(tokens: &[String], module: &[String], modules: &BTreeMap<&[String], usize>) -> Vec<(usize, String)> {
    // The file holding the longest module prefix of an absolute path, and the rest of the path (the name).
    let resolve = |absolute: &[String]| {
        let depth = (0..=absolute.len()).rev().find(|&k| modules.contains_key(&absolute[..k])).unwrap_or(0);
        let name = match &absolute[depth..] {
            [] => absolute.last().map_or("crate".to_string(), String::clone),
            rest => rest.join("::"),
        };
        modules.get(&absolute[..depth]).map(|&file| (file, depth == absolute.len(), name))
    };
    let mut found = Vec::new();
    // Modules imported whole, by the name they are bound to: their uses in this file are what is taken.
    let mut bound: BTreeMap<String, (Vec<String>, usize)> = BTreeMap::new();
    for (path, binding) in paths(tokens, |t| t == "crate" || t == "super") {
        let Some(absolute) = absolute(&path, module) else { continue };
        let Some((file, whole, name)) = resolve(&absolute) else { continue };
        match binding {
            Some(binding) if whole => {
                bound.insert(binding, (absolute, file));
            }
            _ => found.push((file, name)),
        }
    }
    let mut used = BTreeSet::new();
    for (path, _) in paths(tokens, |t| bound.contains_key(t)) {
        let (base, _) = &bound[&path[0]];
        if let Some((file, false, name)) = resolve(&[base, &path[1..]].concat()) {
            found.push((file, name));
            used.insert(path[0].clone());
        }
    }
    // Imported and not used by a path: the module itself is what is taken.
    found.extend(bound.into_iter().filter(|(name, _)| !used.contains(name)).map(|(name, (_, file))| (file, name)));
    found
}

/// `path` from `crate`/`super` to an absolute module path; `None` when a `super` goes above the crate root.
fn absolute(path: &[String], module: &[String]) -> Option<Vec<String>> {
    if path.first().is_some_and(|p| p == "crate") {
        return Some(path[1..].to_vec());
    }
    let up = path.iter().take_while(|p| *p == "super").count();
    let base = module.get(..module.len().checked_sub(up)?)?;
    Some([base, &path[up..]].concat())
}

/// Every path in `tokens` whose first segment `starts` accepts (and that does not continue another path), with a
/// `use` tree's braces expanded: `use crate::{a::B, c::{self, D}}` is `crate::a::B`, `crate::c`, `crate::c::D`.
/// A path in a `use` comes with the name it binds (its last segment, or its `as` alias).
fn paths(tokens: &[String], starts: impl Fn(&str) -> bool) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    for i in 0..tokens.len() {
        let before = |back: usize| if i >= back { tokens[i - back].as_str() } else { "" };
        // Not the middle of a path, a macro's `$crate`, nor a visibility's `pub(in crate::a)`.
        let continued = matches!(before(1), "::" | "$") || (before(1) == "in" && before(2) == "(");
        if starts(&tokens[i]) && tokens.get(i + 1).is_some_and(|t| t == "::") && !continued {
            let start = out.len();
            use_tree(tokens, i, &mut Vec::new(), &mut out);
            if before(1) != "use" {
                out[start..].iter_mut().for_each(|(_, binding)| *binding = None);
            }
        }
    }
    out
}

/// Reads the use tree (or plain path) at `i` below `prefix` into `out`; returns the index after it.
fn use_tree(
    tokens: &[String],
    mut i: usize,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let (depth, start) = (prefix.len(), i);
    let token = |i: usize| tokens.get(i).map_or("", String::as_str);
    loop {
        match token(i) {
            "{" => {
                i += 1;
                while !matches!(token(i), "}" | "") {
                    let next = use_tree(tokens, i, prefix, out);
                    i = if next == i { i + 1 } else { next };
                    if token(i) == "," {
                        i += 1;
                    }
                }
                prefix.truncate(depth);
                return i + 1;
            }
            "*" => {
                prefix.push("*".into());
                i += 1;
                break;
            }
            word if is_identifier(word) && word != "as" => {
                if word != "self" {
                    prefix.push(word.to_string());
                }
                i += 1;
                if token(i) != "::" {
                    break;
                }
                i += 1;
            }
            _ => break,
        }
    }
    let mut binding = prefix.last().filter(|last| *last != "*").cloned();
    if token(i) == "as" {
        binding = Some(token(i + 1).to_string());
        i += 2;
    }
    // A leaf: at least a segment, `self` (the module above it) or `*`.
    if i > start {
        out.push((prefix.clone(), binding));
    }
    prefix.truncate(depth);
    i
}

fn is_identifier(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Drops every item under `#[cfg(test)]` (its further attributes, then up to its `;` or its closing brace);
/// returns the rest, and the modules declared so (`#[cfg(test)] mod testcerts;`), whose files are test code.
fn without_test_items(tokens: Vec<String>) -> (Vec<String>, Vec<String>) {
    const CFG_TEST: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let (mut kept, mut test_modules) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < tokens.len() {
        let attribute = tokens[i..].iter().take(CFG_TEST.len());
        if !attribute.map(String::as_str).eq(CFG_TEST) {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        i += CFG_TEST.len();
        while tokens.get(i).is_some_and(|t| t == "#") {
            i = after_brackets(&tokens, i + 1);
        }
        let start = i;
        i = after_item(&tokens, i);
        if let [.., module, name, end] = &tokens[start..i]
            && module == "mod"
            && end == ";"
        {
            test_modules.push(name.clone());
        }
    }
    (kept, test_modules)
}

/// The index after the item at `i`: after its first `;` outside brackets, or after the brace that closes its body.
fn after_item(tokens: &[String], mut i: usize) -> usize {
    let mut depth = 0usize;
    while let Some(token) = tokens.get(i) {
        i += 1;
        match token.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" => depth = depth.saturating_sub(1),
            "}" => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    break;
                }
            }
            ";" if depth == 0 => break,
            _ => {}
        }
    }
    i
}

/// The index after the bracket that closes the one at `i` (an attribute's `[...]`).
fn after_brackets(tokens: &[String], mut i: usize) -> usize {
    let mut depth = 0usize;
    while let Some(token) = tokens.get(i) {
        i += 1;
        match token.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0 {
            break;
        }
    }
    i
}

/// The tokens of Rust source: identifiers (keywords, numbers), `::` and single punctuation characters. Comments
/// (line, nested block, doc) are dropped; every string, byte string, raw string and character literal is one
/// `""` token, so a path written in one is no path. A lifetime's quote is dropped, its name stays.
fn tokens(source: &str) -> Vec<String> {
    let s: Vec<char> = source.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let word_char = |c: char| c.is_alphanumeric() || c == '_';
    let literal = || String::from("\"\"");
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < s.len() && s[i] != '"' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(literal());
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') closes after one character or escape; a lifetime does not.
            if at(i + 1) == '\\' {
                i += 3;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push(literal());
            } else if at(i + 2) == '\'' {
                i += 3;
                out.push(literal());
            } else {
                i += 1;
            }
        } else if word_char(c) {
            let start = i;
            while i < s.len() && word_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let hashes = s[i..].iter().take_while(|&&c| c == '#').count();
            if matches!(word.as_str(), "r" | "br" | "cr") && at(i + hashes) == '"' {
                // A raw string: up to the quote followed by as many `#`.
                i += hashes + 1;
                while i < s.len() && !(s[i] == '"' && s[i + 1..].iter().take_while(|&&c| c == '#').count() >= hashes) {
                    i += 1;
                }
                i += hashes + 1;
                out.push(literal());
            } else {
                out.push(word);
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push("::".into());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Tarjan's strongly connected components of more than one node.
fn strongly_connected(edges: &Edges) -> Vec<Vec<usize>> {
    struct Walk<'a> {
        edges: &'a Edges,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    fn visit(w: &mut Walk<'_>, v: usize) {
        w.index[v] = Some(w.next);
        w.low[v] = w.next;
        w.next += 1;
        w.stack.push(v);
        w.on_stack[v] = true;
        for &to in w.edges[v].keys() {
            match w.index[to] {
                None => {
                    visit(w, to);
                    w.low[v] = w.low[v].min(w.low[to]);
                }
                Some(index) if w.on_stack[to] => w.low[v] = w.low[v].min(index),
                Some(_) => {}
            }
        }
        if Some(w.low[v]) == w.index[v] {
            let mut component = Vec::new();
            while let Some(top) = w.stack.pop() {
                w.on_stack[top] = false;
                component.push(top);
                if top == v {
                    break;
                }
            }
            if component.len() > 1 {
                w.found.push(component);
            }
        }
    }
    let n = edges.len();
    let mut walk = Walk {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            visit(&mut walk, v);
        }
    }
    walk.found
}

#[cfg(test)]
mod tests {
    use crate::test_tree::tree;
    use std::path::Path;

    use super::{LONG_FUNCTIONS, check, circles_in, graph};

    /// The edges of the crate at `root/krate` as `from -> to: names` lines.
    fn edges(root: &Path) -> Vec<String> {
        let (files, edges) = graph(&root.join("krate/src")).unwrap();
        let mut lines = Vec::new();
        for (from, to) in edges.iter().enumerate() {
            for (to, names) in to {
                let names: Vec<_> = names.iter().map(String::as_str).collect();
                lines.push(format!("{} -> {}: {}", files[from], files[*to], names.join(", ")));
            }
        }
        lines
    }

    const WORKSPACE: &str = "[workspace]\nmembers = [\n    \"tools/krate\",\n    \"tests/other\",\n]\n";

    #[test]
    fn a_two_file_circle_through_use_crate_fails_naming_both_files_and_the_names() {
        let dir = tree(&[
            ("Cargo.toml", WORKSPACE),
            ("tools/krate/src/lib.rs", "#![warn(clippy::too_many_lines)]\npub mod store;\npub mod plan;\n"),
            ("tools/krate/src/store.rs", "use crate::plan::{Plan, Step};\npub struct Store;\n"),
            ("tools/krate/src/plan.rs", "pub fn make() { crate::store::Store::new(); }\n"),
            // Not a product crate: its circle is not looked at.
            ("tests/other/src/lib.rs", "mod a;\nmod b;\n"),
            ("tests/other/src/a.rs", "use crate::b::B;\n"),
            ("tests/other/src/b.rs", "use crate::a::A;\n"),
        ]);
        let error = check(dir.path()).unwrap_err().to_string();
        assert_eq!(error, "1 import circle in product code: tools/krate/src: plan.rs, store.rs");
        let circles = circles_in(dir.path(), "tools/krate").unwrap();
        assert_eq!(
            circles[0].to_string(),
            "xtask: house: import circle in tools/krate/src (2 files): plan.rs, store.rs\n    \
             plan.rs -> store.rs: Store::new\n    store.rs -> plan.rs: Plan, Step"
        );
    }

    #[test]
    fn a_series_registered_by_hand_outside_the_runtime_fails_naming_its_line() {
        let workspace = "[workspace]\nmembers = [\"tools/krate\", \"agents/runtime\"]\n";
        let by_hand = "pub fn m(r: &mut Registry) {\n    r.register(\"up\", \"help\", Gauge::default());\n}\n";
        let runtime = format!("{LONG_FUNCTIONS}\n{by_hand}");
        let dir = tree(&[
            ("Cargo.toml", workspace),
            ("tools/krate/src/lib.rs", "#![warn(clippy::too_many_lines)]\npub mod metrics;\n"),
            ("tools/krate/src/metrics.rs", by_hand),
            // The runtime is where the declaration form registers: not a finding.
            ("agents/runtime/src/lib.rs", &runtime),
        ]);
        let error = check(dir.path()).unwrap_err().to_string();
        assert!(error.contains("tools/krate/src/metrics.rs:2 registers a series by hand"), "{error}");
        assert!(!error.contains("agents/runtime"), "{error}");
        // The same call in a test module is a fixture, not a declaration.
        let in_tests = format!("pub fn m() {{}}\n#[cfg(test)]\nmod tests {{\n{by_hand}}}\n");
        std::fs::write(dir.path().join("tools/krate/src/metrics.rs"), in_tests).unwrap();
        check(dir.path()).unwrap();
    }

    #[test]
    fn a_circle_through_super_is_found_at_any_depth() {
        let dir = tree(&[
            ("krate/src/main.rs", "mod config;\n"),
            ("krate/src/config.rs", "mod parts;\nuse crate::config::parts::Part;\n"),
            ("krate/src/config/parts/mod.rs", "mod deep;\n"),
            ("krate/src/config/parts/deep.rs", "use super::super::Raw;\nuse super::super::super::config;\n"),
        ]);
        let circles = circles_in(dir.path(), "krate").unwrap();
        assert_eq!(circles.len(), 0, "config.rs imports parts/mod.rs, which imports nothing");
        std::fs::write(dir.path().join("krate/src/config.rs"), "mod parts;\nuse parts::deep::Deep;\n").unwrap();
        assert_eq!(edges(dir.path()), ["config/parts/deep.rs -> config.rs: Raw, config"]);
        std::fs::write(dir.path().join("krate/src/config.rs"), "mod parts;\nuse crate::config::parts::deep::Deep;\n")
            .unwrap();
        let circles = circles_in(dir.path(), "krate").unwrap();
        assert_eq!(circles.len(), 1);
        assert_eq!(circles[0].files, ["config.rs", "config/parts/deep.rs"]);
    }

    #[test]
    fn a_circle_formed_only_in_test_code_does_not_count() {
        let dir = tree(&[
            ("krate/src/lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod testdata;\n"),
            (
                "krate/src/a.rs",
                r#"
pub struct A;

#[cfg(test)]
#[allow(unused)]
mod tests {
    use crate::b::B;
    fn f() { if true { crate::b::g(); } }
}

pub fn after() { crate::c(); }
"#,
            ),
            (
                "krate/src/b.rs",
                r#"
use crate::a::A;
#[cfg(test)]
fn sample() -> crate::a::A { crate::testdata::x() }
#[cfg(test)]
const N: [u8; 2] = [0, 1];
"#,
            ),
            ("krate/src/testdata.rs", "use crate::b::B;\n"),
        ]);
        assert!(circles_in(dir.path(), "krate").unwrap().is_empty());
        // What follows a test item is read again.
        assert_eq!(edges(dir.path()), ["a.rs -> lib.rs: c", "b.rs -> a.rs: A"]);
    }

    #[test]
    fn grouped_use_trees_and_whole_module_imports_resolve_to_their_files() {
        let dir = tree(&[
            ("krate/src/lib.rs", "mod a;\nmod c;\nmod user;\n"),
            ("krate/src/a.rs", ""),
            ("krate/src/c.rs", "mod d;\n"),
            ("krate/src/c/d.rs", ""),
            (
                "krate/src/user.rs",
                r#"
pub(crate) use crate::{
    a::B,
    c::{self, d::{E, F as G}},
};
use crate::a as alias;

fn f() { c::helper(); alias::make(); for x in crate::c::d::ALL {} }
pub(in crate::a) fn g() {}
macro_rules! m { () => { $crate::a::B } }
"#,
            ),
        ]);
        assert_eq!(
            edges(dir.path()),
            ["user.rs -> a.rs: B, make", "user.rs -> c.rs: helper", "user.rs -> c/d.rs: ALL, E, F"]
        );
    }

    #[test]
    fn a_path_in_a_comment_string_or_literal_does_not_count() {
        let dir = tree(&[
            ("krate/src/lib.rs", "mod a;\nmod b;\n"),
            ("krate/src/a.rs", "use crate::b::B;\n"),
            (
                "krate/src/b.rs",
                r##"
//! See [`crate::a::A`].
/// crate::a::A
// crate::a::A
/* outer /* crate::a::A */ crate::a::A */
const S: &str = "crate::a::A \" crate::a::A";
const R: &str = r#"crate::a::A " crate::a::A"#;
const C: char = '"'; const Q: char = '\''; fn l<'a>(x: &'a str) -> &'a str { x }
const T: &str = "end"; pub struct B;
"##,
            ),
        ]);
        assert!(circles_in(dir.path(), "krate").unwrap().is_empty());
        assert_eq!(edges(dir.path()), ["a.rs -> b.rs: B"]);
    }

    #[test]
    fn a_missing_role_file_and_a_long_main_are_named() {
        let long_main = "fn main() {}\n".repeat(16);
        let dir = tree(&[
            ("Cargo.toml", "[workspace]\nmembers = [\"agents/runtime\", \"agents/demo\"]\n"),
            // The runtime is no agent: it has none of the role files.
            ("agents/runtime/src/lib.rs", LONG_FUNCTIONS),
            ("agents/demo/src/main.rs", &long_main),
            ("agents/demo/src/lib.rs", LONG_FUNCTIONS),
            ("agents/demo/src/config.rs", ""),
            ("agents/demo/src/error.rs", ""),
            ("agents/demo/src/scope.rs", ""),
            ("agents/demo/src/metrics.rs", ""),
            ("agents/demo/src/schedule.rs", ""),
        ]);
        assert_eq!(
            check(dir.path()).unwrap_err().to_string(),
            "3 role file problems: agents/demo/src/scope/rbac.rs is missing (the Roles from the same plan); \
             agents/demo/src/cli.rs is missing (the one-shots); agents/demo/src/main.rs has 16 lines, at most 15: it \
             only calls `cli::main::<Agent>()`"
        );
        std::fs::remove_file(dir.path().join("agents/demo/src/schedule.rs")).unwrap();
        let error = check(dir.path()).unwrap_err().to_string();
        assert!(error.contains("agents/demo/src has neither reconcile.rs nor schedule.rs"), "{error}");
    }

    #[test]
    fn a_product_crate_without_the_length_lint_is_named_and_a_test_crate_is_not_asked() {
        let workspace = "[workspace]\nmembers = [\"tools/krate\", \"agents/runtime\", \"tests/other\"]\n";
        let dir = tree(&[
            ("Cargo.toml", workspace),
            ("tools/krate/src/main.rs", "fn main() {}\n"),
            // Not the attribute: a comment naming it, and the lint allowed.
            ("agents/runtime/src/lib.rs", "// #![warn(clippy::too_many_lines)]\n#![allow(clippy::too_many_lines)]\n"),
            ("tests/other/src/lib.rs", ""),
        ]);
        assert_eq!(
            check(dir.path()).unwrap_err().to_string(),
            "2 crates without the length lint: tools/krate/src/main.rs lacks `#![warn(clippy::too_many_lines)]`: a \
             function stays within 100 lines of code; agents/runtime/src/lib.rs lacks \
             `#![warn(clippy::too_many_lines)]`: a function stays within 100 lines of code"
        );
        std::fs::write(dir.path().join("tools/krate/src/main.rs"), format!("{LONG_FUNCTIONS}\nfn main() {{}}\n"))
            .unwrap();
        std::fs::write(dir.path().join("agents/runtime/src/lib.rs"), LONG_FUNCTIONS).unwrap();
        check(dir.path()).unwrap();
    }

    #[test]
    fn ca_syncer_has_no_import_circle() {
        let root = crate::images::workspace_root();
        let circles = circles_in(&root, "agents/ca-syncer").unwrap();
        assert!(circles.is_empty(), "{}", circles.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
    }
}
