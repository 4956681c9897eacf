//! Corefile mode: our rules live in a clearly marked block inside one server block (`.:53`) of a Corefile
//! that someone else owns (kubeadm, a cluster's admins). Every byte outside the block is kept: the block is
//! inserted as whole lines just before the line holding the server block's closing `}`, replaced in place,
//! or removed as exactly the lines it occupies, so insert-then-remove gives back the original text.
//! Anything ambiguous (two blocks, a lone marker, a block outside the server block, no or two matching server
//! blocks, a closing brace sharing its line) is refused: a person has to look.
//!
//! The markers are those of the runtime's marked-block module (`runtime-blocks` branch, not merged when this
//! was written), so a block written by this module is found by that one. Once it is merged this module
//! should be folded into it; only the structure is parsed here (Caddyfile tokens), what the block says is
//! [`crate::render`]'s business.

use std::ops::Range;

use crate::hostname::Domain;

/// The block's owner id in its markers.
pub const BLOCK_ID: &str = "dns-rewriter";
const BEGIN: &str = "# kcp-keeper:begin";
const END: &str = "# kcp-keeper:end";
const DEFAULT_INDENT: &str = "    ";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("{0} begin markers; expected at most one")]
    DuplicateBegin(usize),
    #[error("{0} end markers; expected at most one")]
    DuplicateEnd(usize),
    #[error("the block begins on line {0} but never ends")]
    Unterminated(usize),
    #[error("an end marker on line {0} has no begin marker before it")]
    EndWithoutBegin(usize),
    #[error("the block lies outside the configured server block")]
    OutsideServerBlock,
    #[error("no server block with the configured key")]
    NoServerBlock,
    #[error("{0} server blocks with the configured key; expected one")]
    AmbiguousServerBlock(usize),
    #[error("the closing brace of the server block shares line {0} with other content")]
    ClosingBraceNotAlone(usize),
    #[error("unbalanced braces or quotes at line {0}")]
    Unbalanced(usize),
    #[error("a brace on line {0} is attached to a word: put braces apart with spaces")]
    AmbiguousBrace(usize),
    #[error("the block's content holds a marker line or braces")]
    InvalidContent,
}

impl BlockError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidContent => "invalid_content",
            Self::NoServerBlock => "no_server_block",
            _ => "ambiguous",
        }
    }
}

/// Why a Corefile candidate was refused before writing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CandidateError {
    #[error("the candidate Corefile: {0}")]
    Block(#[from] BlockError),
    #[error("the candidate Corefile has no block of ours")]
    NoBlock,
    #[error("the candidate's block: {0}")]
    Grammar(#[from] crate::render::GrammarError),
    #[error("the candidate changes bytes outside its block")]
    ForeignBytesChanged,
}

/// The content of our block in `corefile` (lines without indentation, each ending in a newline), or `None`.
pub fn content(corefile: &str, server_key: &str) -> Result<Option<String>, BlockError> {
    let server = server_block(corefile, server_key)?;
    let Some(found) = locate(corefile, &server)? else { return Ok(None) };
    let body: Vec<&str> = corefile[found.lines].lines().collect();
    let mut out = String::new();
    for line in &body[1..body.len() - 1] {
        let line = line.trim_end_matches('\r');
        out.push_str(line.strip_prefix(found.indent.as_str()).unwrap_or(line.trim_start()));
        out.push('\n');
    }
    Ok(Some(out))
}

/// `corefile` with our block set to `content`, or removed when `content` is `None`. Every other byte is kept.
pub fn set(corefile: &str, server_key: &str, content: Option<&str>) -> Result<String, BlockError> {
    let server = server_block(corefile, server_key)?;
    let found = locate(corefile, &server)?;
    let newline = if corefile.contains("\r\n") { "\r\n" } else { "\n" };
    let block = |indent: &str, content: &str| render_block(indent, content, newline);
    let (range, replacement) = match (found, content) {
        (Some(found), Some(content)) => (found.lines, block(&found.indent, content)?),
        (Some(found), None) => (found.lines, String::new()),
        (None, Some(content)) => (server.close_line_start..server.close_line_start, block(&server.indent, content)?),
        (None, None) => return Ok(corefile.to_string()),
    };
    Ok(format!("{}{replacement}{}", &corefile[..range.start], &corefile[range.end..]))
}

/// The block as it appears in a Corefile, without indentation (what `render` prints in Corefile mode).
pub fn standalone(content: &str) -> Result<String, BlockError> {
    render_block("", content, "\n")
}

fn render_block(indent: &str, content: &str, newline: &str) -> Result<String, BlockError> {
    check_content(content)?;
    let mut out =
        format!("{indent}{BEGIN} {BLOCK_ID} (managed by kcp-keeper: edits inside this block are overwritten){newline}");
    for line in content.lines() {
        if line.trim().is_empty() {
            out.push_str(newline);
        } else {
            out.push_str(&format!("{indent}{}{newline}", line.trim_end_matches('\r')));
        }
    }
    out.push_str(&format!("{indent}{END} {BLOCK_ID}{newline}"));
    Ok(out)
}

/// The pre-write check of Corefile mode: the candidate's block passes the renderer's grammar, and the
/// candidate equals `original` outside the block.
pub fn check_candidate(
    original: &str,
    candidate: &str,
    server_key: &str,
    domain: &Domain,
) -> Result<usize, CandidateError> {
    let block = content(candidate, server_key)?.ok_or(CandidateError::NoBlock)?;
    let rules = crate::render::check(&block, domain)?;
    if set(candidate, server_key, None)? != set(original, server_key, None)? {
        return Err(CandidateError::ForeignBytesChanged);
    }
    Ok(rules)
}

fn check_content(content: &str) -> Result<(), BlockError> {
    let bad = content.lines().any(|l| {
        let t = l.trim();
        t.starts_with(BEGIN) || t.starts_with(END)
    });
    let tokens = tokens(content).map_err(|_| BlockError::InvalidContent)?;
    if bad || tokens.iter().any(|t| t.kind != Kind::Word) {
        return Err(BlockError::InvalidContent);
    }
    Ok(())
}

#[derive(Debug)]
struct Found {
    /// The block's lines, markers included, with their line ends.
    lines: Range<usize>,
    indent: String,
}

fn locate(text: &str, server: &ServerBlock) -> Result<Option<Found>, BlockError> {
    let mut begins = Vec::new();
    let mut ends = Vec::new();
    for (i, range) in lines(text).enumerate() {
        let trimmed = text[range.clone()].trim();
        if is_marker(trimmed, BEGIN) {
            begins.push((i + 1, range));
        } else if is_marker(trimmed, END) {
            ends.push((i + 1, range));
        }
    }
    match (begins.as_slice(), ends.as_slice()) {
        ([], []) => Ok(None),
        (b, _) if b.len() > 1 => Err(BlockError::DuplicateBegin(b.len())),
        (_, e) if e.len() > 1 => Err(BlockError::DuplicateEnd(e.len())),
        ([(line, _)], []) => Err(BlockError::Unterminated(*line)),
        ([], [(line, _)]) => Err(BlockError::EndWithoutBegin(*line)),
        ([(_, begin)], [(line, end)]) => {
            if end.start < begin.start {
                return Err(BlockError::EndWithoutBegin(*line));
            }
            if begin.start <= server.open || end.end > server.close_line_start {
                return Err(BlockError::OutsideServerBlock);
            }
            let line = &text[begin.clone()];
            let indent = line[..line.len() - line.trim_start().len()].to_string();
            Ok(Some(Found { lines: begin.start..end.end, indent }))
        }
        _ => unreachable!("every length combination is matched above"),
    }
}

fn is_marker(trimmed: &str, prefix: &str) -> bool {
    trimmed
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|rest| rest.strip_prefix(BLOCK_ID))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
}

/// Byte ranges of the lines of `text`, each with its line end.
fn lines(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let end = text[start..].find('\n').map_or(text.len(), |i| start + i + 1);
        let range = start..end;
        start = end;
        Some(range)
    })
}

#[derive(Debug)]
struct ServerBlock {
    /// Offset of the opening brace.
    open: usize,
    /// Offset of the start of the line holding the closing brace.
    close_line_start: usize,
    /// Indentation of the block's first directive.
    indent: String,
}

/// The one top-level server block whose keys include `key` (a `dns://` prefix and trailing commas ignored).
fn server_block(text: &str, key: &str) -> Result<ServerBlock, BlockError> {
    let wanted = normalize_key(key);
    let mut depth = 0usize;
    let mut keys: Vec<&str> = Vec::new();
    let mut current: Option<(usize, bool)> = None;
    let mut first_directive: Option<usize> = None;
    let mut matches = Vec::new();
    for token in tokens(text)? {
        match token.kind {
            Kind::Open => {
                if depth == 0 {
                    current = Some((token.start, keys.iter().any(|k| normalize_key(k) == wanted)));
                    first_directive = None;
                    keys.clear();
                }
                depth += 1;
            }
            Kind::Close => {
                depth = depth.checked_sub(1).ok_or(BlockError::Unbalanced(line_of(text, token.start)))?;
                if depth == 0
                    && let Some((open, true)) = current.take()
                {
                    let line_start = text[..token.start].rfind('\n').map_or(0, |i| i + 1);
                    if !text[line_start..token.start].trim().is_empty() {
                        return Err(BlockError::ClosingBraceNotAlone(line_of(text, token.start)));
                    }
                    let indent = first_directive
                        .filter(|&at| line_of(text, at) != line_of(text, open))
                        .map(|at| text[text[..at].rfind('\n').map_or(0, |i| i + 1)..at].to_string())
                        .filter(|indent| indent.trim().is_empty())
                        .unwrap_or_else(|| DEFAULT_INDENT.into());
                    matches.push(ServerBlock { open, close_line_start: line_start, indent });
                }
            }
            Kind::Word if depth == 0 => keys.push(&text[token.start..token.end]),
            Kind::Word => {
                if depth == 1 && first_directive.is_none() {
                    first_directive = Some(token.start);
                }
            }
        }
    }
    if depth != 0 {
        return Err(BlockError::Unbalanced(line_of(text, text.len())));
    }
    match matches.len() {
        0 => Err(BlockError::NoServerBlock),
        1 => Ok(matches.remove(0)),
        n => Err(BlockError::AmbiguousServerBlock(n)),
    }
}

fn normalize_key(key: &str) -> &str {
    let key = key.trim_end_matches(',');
    key.strip_prefix("dns://").unwrap_or(key)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Open,
    Close,
    Word,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    kind: Kind,
    start: usize,
    end: usize,
}

/// Caddyfile tokens with byte offsets: whitespace-separated, `#` comments skipped, quoted strings as one word,
/// `{`/`}` alone as braces, `{$ENV}`-style placeholders as words.
fn tokens(text: &str) -> Result<Vec<Token>, BlockError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if b == b'#' {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        if b == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            if i >= bytes.len() {
                return Err(BlockError::Unbalanced(line_of(text, start)));
            }
            i += 1;
            out.push(Token { kind: Kind::Word, start, end: i });
            continue;
        }
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let kind = match &text[start..i] {
            "{" => Kind::Open,
            "}" => Kind::Close,
            w if w.len() > 2 && w.starts_with('{') && w.ends_with('}') => Kind::Word,
            w if w.ends_with('{') || w.starts_with('}') => {
                return Err(BlockError::AmbiguousBrace(line_of(text, start)));
            }
            _ => Kind::Word,
        };
        out.push(Token { kind, start, end: i });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostname::Hostname;
    use crate::render::{HEADER, render};
    use crate::rules::{RuleSet, ServiceRef, Target};

    /// kubeadm's default Corefile.
    const KUBEADM: &str = ".:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
";

    /// A Corefile with a second server block, comments, quotes and an odd indentation, which must survive.
    const ODD: &str = "# the cluster's DNS\nexample.org:53 {\n\tforward . 9.9.9.9\n}\n\n.:53 {\n\terrors # keep\n\tkubernetes cluster.local {\n\t\tpods \"in secure\"\n\t}\n\treload\n}\n";

    fn domain() -> Domain {
        Domain::parse("cluster.local").unwrap()
    }

    fn snippet(pairs: &[(&str, &str)]) -> String {
        let mut set = RuleSet::new();
        for (host, svc) in pairs {
            let target = Target { service: ServiceRef::parse("kcp-system", svc).unwrap(), cluster_ip: None };
            set.insert(Hostname::parse(host).unwrap(), target).unwrap();
        }
        render(&set, &domain())
    }

    #[test]
    fn the_block_is_inserted_before_the_closing_brace_with_the_servers_indentation() {
        let text = snippet(&[("kcp-root.example.com", "root-kcp")]);
        let out = set(KUBEADM, ".:53", Some(&text)).unwrap();
        let expected_tail = "    loadbalance\n    # kcp-keeper:begin dns-rewriter (managed by kcp-keeper: edits inside this block are overwritten)\n    # Managed by kcp-keeper (dns-rewriter); edits here are overwritten.\n    # Split horizon: each kcp public name below answers with its in-cluster Service.\n    rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n    # kcp-keeper:end dns-rewriter\n}\n";
        assert!(out.ends_with(expected_tail), "{out}");
        assert_eq!(content(&out, ".:53").unwrap().as_deref(), Some(text.as_str()));
        let odd = set(ODD, ".:53", Some(&text)).unwrap();
        assert!(odd.contains("\treload\n\t# kcp-keeper:begin dns-rewriter"), "{odd}");
        assert!(odd.starts_with("# the cluster's DNS\nexample.org:53 {\n\tforward . 9.9.9.9\n}\n"), "{odd}");
    }

    #[test]
    fn many_cycles_change_only_the_block_and_removal_restores_every_byte() {
        for original in [KUBEADM, ODD, &KUBEADM.replace('\n', "\r\n")] {
            let one = snippet(&[("a.example.com", "a"), ("b.example.com", "b")]);
            let two = snippet(&[("a.example.com", "a"), ("b.example.com", "b"), ("c.example.com", "c")]);
            let mut text = original.to_string();
            for cycle in 0..20 {
                let lines = if cycle % 2 == 0 { &one } else { &two };
                let next = set(&text, ".:53", Some(lines)).unwrap();
                assert_eq!(set(&next, ".:53", Some(lines)).unwrap(), next, "setting the same content is a no-op");
                assert_eq!(set(&next, ".:53", None).unwrap(), original, "outside the block nothing changed");
                text = next;
            }
            assert_eq!(set(&text, ".:53", None).unwrap(), original);
        }
    }

    #[test]
    fn removing_a_rule_removes_exactly_its_line() {
        let three = snippet(&[("a.example.com", "a"), ("b.example.com", "b"), ("c.example.com", "c")]);
        let two = snippet(&[("a.example.com", "a"), ("c.example.com", "c")]);
        let before = set(KUBEADM, ".:53", Some(&three)).unwrap();
        let after = set(&before, ".:53", Some(&two)).unwrap();
        let removed: Vec<&str> = before.lines().filter(|l| !after.lines().any(|a| a == *l)).collect();
        assert_eq!(removed, vec!["    rewrite name exact b.example.com. b.kcp-system.svc.cluster.local."]);
        assert_eq!(before.lines().count(), after.lines().count() + 1);
    }

    #[test]
    fn the_server_block_is_found_by_key_with_a_port_placeholder_or_scheme() {
        let lines = snippet(&[("a.example.com", "a")]);
        let text = ".:{{port}} {\n    errors\n}\n";
        assert!(set(text, ".:{{port}}", Some(&lines)).unwrap().contains("rewrite name exact a.example.com."));
        assert!(set("dns://.:53 {\n    errors\n}\n", ".:53", Some(&lines)).is_ok());
        assert!(set(".:53, example.com:53 {\n    errors\n}\n", ".:53", Some(&lines)).is_ok());
    }

    #[test]
    fn ambiguous_corefiles_are_refused() {
        let lines = snippet(&[("a.example.com", "a")]);
        let block = set(KUBEADM, ".:53", Some(&lines)).unwrap();
        let begin = block.lines().find(|l| l.contains("kcp-keeper:begin")).unwrap().to_string();
        let end = block.lines().find(|l| l.contains("kcp-keeper:end")).unwrap().to_string();
        let cases: Vec<(String, BlockError)> = vec![
            (KUBEADM.replace(".:53", ".:5353"), BlockError::NoServerBlock),
            (format!("{KUBEADM}{KUBEADM}"), BlockError::AmbiguousServerBlock(2)),
            (KUBEADM.replace("    loadbalance\n}", "    loadbalance }"), BlockError::ClosingBraceNotAlone(22)),
            (KUBEADM.replace("}\n", ""), BlockError::Unbalanced(19)),
            (KUBEADM.replace("health {", "health{"), BlockError::AmbiguousBrace(3)),
            (block.replacen(&end, "", 1), BlockError::Unterminated(23)),
            (block.replacen(&begin, "", 1), BlockError::EndWithoutBegin(27)),
            (block.replacen(&end, &format!("{end}\n{begin}\n{end}"), 1), BlockError::DuplicateBegin(2)),
            (format!("{block}{}\n", end.trim()), BlockError::DuplicateEnd(2)),
            (format!("{}\n{}\n{KUBEADM}", begin.trim(), end.trim()), BlockError::OutsideServerBlock),
        ];
        for (text, want) in cases {
            assert_eq!(set(&text, ".:53", Some(&lines)).unwrap_err(), want, "{text}");
        }
    }

    #[test]
    fn content_that_could_break_out_of_the_block_is_refused() {
        for bad in ["}\n", "forward . 1.1.1.1 {\n", "# kcp-keeper:end dns-rewriter\n", "\"open\n"] {
            assert_eq!(set(KUBEADM, ".:53", Some(bad)).unwrap_err(), BlockError::InvalidContent, "{bad:?}");
        }
    }

    #[test]
    fn the_pre_write_check_accepts_our_candidate_and_refuses_tampering() {
        let lines = snippet(&[("a.example.com", "a"), ("b.example.com", "b")]);
        let candidate = set(KUBEADM, ".:53", Some(&lines)).unwrap();
        assert_eq!(check_candidate(KUBEADM, &candidate, ".:53", &domain()), Ok(2));
        let foreign = candidate.replace("ttl 30", "ttl 5");
        assert_eq!(check_candidate(KUBEADM, &foreign, ".:53", &domain()), Err(CandidateError::ForeignBytesChanged));
        assert_eq!(check_candidate(KUBEADM, KUBEADM, ".:53", &domain()), Err(CandidateError::NoBlock));
        let hosts = set(KUBEADM, ".:53", Some(&format!("{HEADER}hosts 10.0.0.1 a.example.com\n"))).unwrap();
        assert!(matches!(check_candidate(KUBEADM, &hosts, ".:53", &domain()), Err(CandidateError::Grammar(_))));
    }
}
