//! A clearly marked block of lines that kcp-keeper owns inside text another writer owns: the Corefile of a
//! kubeadm-style cluster, where dns-rewriter keeps its rewrite rules inside the `.:53 { ... }` server block of
//! `kube-system/coredns` (a ConfigMap kubeadm created and may rewrite).
//!
//! The rules that make sharing one key safe:
//! - Every byte outside the block stays as it was: the block is inserted as whole lines just before the line
//!   holding the server block's closing `}`, replaced in place, or removed as exactly the lines it occupies, so
//!   insert-then-remove gives back the original bytes.
//! - Byte-stable and idempotent: the output depends only on the input text and the desired lines, and setting
//!   the same content twice changes nothing (CoreDNS's `reload` restarts the server on any byte change).
//! - Refuse what is ambiguous rather than guess: two begin markers, an end without a begin, an unterminated
//!   block, a block outside the server block, no or two matching server blocks, a closing brace that shares
//!   its line, or content that would itself look like a marker or unbalance the braces. A refusal writes
//!   nothing; a person has to look.
//!
//! A block may also sit at the file's top level ([`MarkedBlock::top_level`]): it then holds whole server blocks
//! of its own (dns-rewriter's in node-local-dns's Corefile), is inserted at the end of the file, and must lie
//! outside every server block.
//!
//! Only the structure is parsed (Caddyfile tokens: whitespace-separated, `#` comments, `"` quotes, `{`/`}` as
//! their own tokens, `{$ENV}` substitutions as words); what the block says is the renderer's business.
//! The write path, against a ConfigMap key, is [`configmap`].

pub mod configmap;

use std::ops::Range;

/// Marker lines start with this; the id and a note follow.
const BEGIN: &str = "# kcp-keeper:begin";
const END: &str = "# kcp-keeper:end";
const DEFAULT_INDENT: &str = "    ";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("block id {0:?} must be lowercase letters, digits and dashes")]
    InvalidId(String),
    #[error("{0} begin markers for block {1:?}; expected at most one")]
    DuplicateBegin(usize, String),
    #[error("{0} end markers for block {1:?}; expected at most one")]
    DuplicateEnd(usize, String),
    #[error("block {0:?} begins on line {1} but never ends")]
    Unterminated(String, usize),
    #[error("block {0:?} has an end marker (line {1}) without a begin marker before it")]
    EndWithoutBegin(String, usize),
    #[error("block {0:?} lies outside the {1} server block")]
    OutsideServerBlock(String, String),
    #[error("no server block for {0}")]
    NoServerBlock(String),
    #[error("{0} server blocks for {1}; expected one")]
    AmbiguousServerBlock(usize, String),
    #[error("the closing brace of the {0} server block shares line {1} with other content")]
    ClosingBraceNotAlone(String, usize),
    #[error("unbalanced braces at line {0}")]
    Unbalanced(usize),
    #[error("token {0:?} on line {1} is ambiguous: put braces apart with spaces")]
    AmbiguousBrace(String, usize),
    #[error("the block's content holds a kcp-keeper marker line")]
    ContentHasMarker,
    #[error("the block's content has unbalanced braces")]
    ContentUnbalanced,
    #[error("block {0:?} lies inside a server block; it belongs at the top level")]
    InsideServerBlock(String),
    #[error("the text does not end with a line end, so a block cannot be added after it byte for byte")]
    NoFinalNewline,
}

impl BlockError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidId(_) | Self::ContentHasMarker | Self::ContentUnbalanced => "invalid_content",
            Self::NoServerBlock(_) => "no_server_block",
            _ => "ambiguous",
        }
    }
}

/// One marked block (`id`) inside one Corefile server block (`server_key`, e.g. `.:53`), or at the top level
/// (`server_key` `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedBlock {
    id: String,
    server_key: Option<String>,
}

/// Where an existing block sits: the byte range of its lines (marker lines included, with their line ends).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    lines: Range<usize>,
    indent: String,
}

impl MarkedBlock {
    /// `id` names the owner (e.g. `dns-rewriter`); `server_key` the server block (`.:53`).
    pub fn new(id: &str, server_key: &str) -> Result<Self, BlockError> {
        Ok(Self { server_key: Some(server_key.into()), ..Self::top_level(id)? })
    }

    /// A block at the file's top level, outside every server block: its content is whole server blocks.
    /// When absent it is added at the end of the file.
    pub fn top_level(id: &str) -> Result<Self, BlockError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return Err(BlockError::InvalidId(id.into()));
        }
        Ok(Self { id: id.into(), server_key: None })
    }

    fn begin_line(&self) -> String {
        format!("{BEGIN} {} (managed by kcp-keeper: edits inside this block are overwritten)", self.id)
    }

    fn end_line(&self) -> String {
        format!("{END} {}", self.id)
    }

    /// The block's current lines (without markers and indentation), or `None` when there is no block.
    pub fn content(&self, text: &str) -> Result<Option<String>, BlockError> {
        let Some(found) = self.locate(text)? else { return Ok(None) };
        let body: Vec<&str> = text[found.lines].lines().collect();
        let inner = &body[1..body.len() - 1];
        Ok(Some(
            inner
                .iter()
                .map(|l| l.strip_prefix(found.indent.as_str()).unwrap_or(l.trim_start()))
                .collect::<Vec<_>>()
                .join("\n"),
        ))
    }

    /// `text` with the block set to `content` (lines, without indentation), or removed when `content` is
    /// `None`. Every byte outside the block is kept.
    pub fn set(&self, text: &str, content: Option<&str>) -> Result<String, BlockError> {
        let found = self.locate(text)?;
        // Where a new block goes, and its indentation: before the server block's closing brace, or at the end.
        let (insert_at, indent) = match &self.server_key {
            Some(key) => {
                let server = server_block(text, key)?;
                (server.close_line_start, server.indent)
            }
            None => {
                if depth_at(text, text.len())? != 0 {
                    return Err(BlockError::Unbalanced(line_of(text, text.len())));
                }
                if !text.is_empty() && !text.ends_with('\n') {
                    return Err(BlockError::NoFinalNewline);
                }
                (text.len(), String::new())
            }
        };
        let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
        let rendered = |indent: &str, content: &str| -> Result<String, BlockError> {
            check_content(content)?;
            let mut out = format!("{indent}{}{newline}", self.begin_line());
            for line in content.lines() {
                let line = line.trim_end_matches('\r');
                if line.trim().is_empty() {
                    out.push_str(newline);
                } else {
                    out.push_str(&format!("{indent}{line}{newline}"));
                }
            }
            out.push_str(&format!("{indent}{}{newline}", self.end_line()));
            Ok(out)
        };
        let mut out = String::with_capacity(text.len() + 256);
        match (found, content) {
            (Some(found), Some(content)) => {
                out.push_str(&text[..found.lines.start]);
                out.push_str(&rendered(&found.indent, content)?);
                out.push_str(&text[found.lines.end..]);
            }
            (Some(found), None) => {
                out.push_str(&text[..found.lines.start]);
                out.push_str(&text[found.lines.end..]);
            }
            (None, Some(content)) => {
                out.push_str(&text[..insert_at]);
                out.push_str(&rendered(&indent, content)?);
                out.push_str(&text[insert_at..]);
            }
            (None, None) => out.push_str(text),
        }
        Ok(out)
    }

    /// `text` without the lines directly inside the server block (not in a block nested in it) that `is_ours`
    /// claims (it gets each line trimmed), and those lines (trimmed), in order: the block's own lines after another tool
    /// dropped its markers (kubeadm migrates a customised Corefile with coredns/corefile-migration, which drops
    /// every comment and keeps the plugin lines). Only while `text` holds no block: with one, nothing is
    /// claimed and `text` comes back as it is. Every other byte is kept.
    pub fn unmarked(&self, text: &str, is_ours: impl Fn(&str) -> bool) -> Result<(String, Vec<String>), BlockError> {
        let Some(key) = &self.server_key else { return Ok((text.to_string(), Vec::new())) };
        if self.locate(text)?.is_some() {
            return Ok((text.to_string(), Vec::new()));
        }
        let server = server_block(text, key)?;
        let tokens = tokens(text)?;
        let mut next = tokens.iter().filter(|t| t.start > server.open).peekable();
        let (mut depth, mut claimed) = (0i64, Vec::new());
        let mut out = String::with_capacity(text.len());
        for range in lines(text) {
            while let Some(t) = next.next_if(|t| t.start < range.start) {
                match t.kind {
                    Kind::Open => depth += 1,
                    Kind::Close => depth -= 1,
                    Kind::Word => {}
                }
            }
            let inside = range.start > server.open && range.start < server.close_line_start && depth == 0;
            let line = text[range.clone()].trim();
            if inside && is_ours(line) {
                claimed.push(line.to_string());
            } else {
                out.push_str(&text[range]);
            }
        }
        Ok((out, claimed))
    }

    /// Finds the block, refusing anything ambiguous, and checks it lies inside the server block.
    fn locate(&self, text: &str) -> Result<Option<Found>, BlockError> {
        let mut begins = Vec::new();
        let mut ends = Vec::new();
        for (number, range) in lines(text).enumerate() {
            let trimmed = text[range.clone()].trim();
            if is_marker(trimmed, BEGIN, &self.id) {
                begins.push((number + 1, range));
            } else if is_marker(trimmed, END, &self.id) {
                ends.push((number + 1, range));
            }
        }
        let id = || self.id.clone();
        match (begins.as_slice(), ends.as_slice()) {
            ([], []) => Ok(None),
            (b, _) if b.len() > 1 => Err(BlockError::DuplicateBegin(b.len(), id())),
            (_, e) if e.len() > 1 => Err(BlockError::DuplicateEnd(e.len(), id())),
            ([(line, _)], []) => Err(BlockError::Unterminated(id(), *line)),
            ([], [(line, _)]) => Err(BlockError::EndWithoutBegin(id(), *line)),
            ([(_, begin)], [(line, end)]) => {
                if end.start < begin.start {
                    return Err(BlockError::EndWithoutBegin(id(), *line));
                }
                match &self.server_key {
                    Some(key) => {
                        let server = server_block(text, key)?;
                        if begin.start <= server.open || end.end > server.close_line_start {
                            return Err(BlockError::OutsideServerBlock(id(), key.clone()));
                        }
                    }
                    None => {
                        if depth_at(text, begin.start)? != 0 || depth_at(text, end.start)? != 0 {
                            return Err(BlockError::InsideServerBlock(id()));
                        }
                    }
                }
                let line = &text[begin.clone()];
                let indent = line[..line.len() - line.trim_start().len()].to_string();
                Ok(Some(Found { lines: begin.start..end.end, indent }))
            }
            _ => unreachable!("every length combination is matched above"),
        }
    }
}

fn is_marker(trimmed: &str, prefix: &str, id: &str) -> bool {
    trimmed
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|rest| rest.strip_prefix(id))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
}

/// Byte ranges of the lines of `text`, each including its line end.
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

fn check_content(content: &str) -> Result<(), BlockError> {
    if content.lines().any(|l| {
        let t = l.trim();
        t.starts_with(BEGIN) || t.starts_with(END)
    }) {
        return Err(BlockError::ContentHasMarker);
    }
    let mut depth = 0i64;
    for token in tokens(content).map_err(|_| BlockError::ContentUnbalanced)? {
        match token.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth -= 1,
            Kind::Word => {}
        }
        if depth < 0 {
            return Err(BlockError::ContentUnbalanced);
        }
    }
    if depth != 0 {
        return Err(BlockError::ContentUnbalanced);
    }
    Ok(())
}

/// How many blocks are open at byte `offset` of `text`.
fn depth_at(text: &str, offset: usize) -> Result<i64, BlockError> {
    let mut depth = 0i64;
    for token in tokens(text)?.iter().take_while(|t| t.start < offset) {
        match token.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth -= 1,
            Kind::Word => {}
        }
    }
    Ok(depth)
}

/// The server block's opening brace, the start of the line of its closing brace, and the indentation of its
/// first directive.
#[derive(Debug)]
struct ServerBlock {
    open: usize,
    close_line_start: usize,
    indent: String,
}

/// Finds the one top-level server block whose keys include `key` (`dns://` prefixes and trailing commas
/// ignored).
fn server_block(text: &str, key: &str) -> Result<ServerBlock, BlockError> {
    let wanted = normalize_key(key);
    let mut depth = 0usize;
    let mut keys: Vec<&str> = Vec::new();
    let mut current: Option<(usize, bool)> = None; // (open offset, matches)
    let mut matches = Vec::new();
    let mut first_directive: Option<usize> = None;
    for token in tokens(text)? {
        match token.kind {
            Kind::Open => {
                if depth == 0 {
                    let is_ours = keys.iter().any(|k| normalize_key(k) == wanted);
                    current = Some((token.start, is_ours));
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
                        return Err(BlockError::ClosingBraceNotAlone(key.into(), line_of(text, token.start)));
                    }
                    let indent = first_directive
                        .filter(|&at| line_of(text, at) != line_of(text, open))
                        .map(|at| {
                            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                            text[line_start..at].to_string()
                        })
                        .filter(|indent| indent.trim().is_empty())
                        .unwrap_or_else(|| DEFAULT_INDENT.into());
                    matches.push(ServerBlock { open, close_line_start: line_start, indent });
                }
            }
            Kind::Word => {
                if depth == 0 {
                    keys.push(&text[token.start..token.end]);
                } else if depth == 1 && first_directive.is_none() {
                    first_directive = Some(token.start);
                }
            }
        }
    }
    if depth != 0 {
        return Err(BlockError::Unbalanced(line_of(text, text.len())));
    }
    match matches.len() {
        0 => Err(BlockError::NoServerBlock(key.into())),
        1 => Ok(matches.remove(0)),
        n => Err(BlockError::AmbiguousServerBlock(n, key.into())),
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

/// Caddyfile tokens with their byte offsets: comments skipped, quoted strings as one word.
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
        let word = &text[start..i];
        let kind = match word {
            "{" => Kind::Open,
            "}" => Kind::Close,
            // `{$ENV}` and `{%ENV%}` substitutions are words.
            w if w.len() > 2 && w.starts_with('{') && w.ends_with('}') => Kind::Word,
            w if w.ends_with('{') || w.starts_with('}') => {
                return Err(BlockError::AmbiguousBrace(w.into(), line_of(text, start)));
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

    /// kubeadm's default Corefile.
    const KUBEADM: &str = testbed::coredns::KUBEADM_DEFAULT_COREFILE;

    const RULES: &str = "rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\nrewrite name exact kcp.example.com. front-proxy.kcp-system.svc.cluster.local.";

    fn block() -> MarkedBlock {
        MarkedBlock::new("dns-rewriter", ".:53").unwrap()
    }

    #[test]
    fn insert_goes_before_the_closing_brace_of_the_server_block_and_keeps_every_other_byte() {
        let out = block().set(KUBEADM, Some(RULES)).unwrap();
        let (before, after) = KUBEADM.split_at(KUBEADM.rfind("}\n").unwrap());
        assert!(out.starts_with(before) && out.ends_with(after), "{out}");
        let inserted = &out[before.len()..out.len() - after.len()];
        assert_eq!(
            inserted,
            "    # kcp-keeper:begin dns-rewriter (managed by kcp-keeper: edits inside this block are overwritten)\n    rewrite name exact kcp-root.example.com. root-kcp.kcp-system.svc.cluster.local.\n    rewrite name exact kcp.example.com. front-proxy.kcp-system.svc.cluster.local.\n    # kcp-keeper:end dns-rewriter\n"
        );
        assert_eq!(block().content(&out).unwrap().as_deref(), Some(RULES));
    }

    #[test]
    fn unmarked_lines_directly_in_the_server_block_are_claimed_only_while_there_is_no_block() {
        let ours = |l: &str| l.starts_with("rewrite name exact ");
        let nested = ".:53 {\n    errors\n    other {\n        rewrite name exact a. b.\n    }\n    rewrite name exact c. d.\n}\nx:53 {\n    rewrite name exact e. f.\n}\n";
        let (left, claimed) = block().unmarked(nested, ours).unwrap();
        assert_eq!(claimed, ["rewrite name exact c. d."], "only the line directly in .:53");
        assert_eq!(left, nested.replace("    rewrite name exact c. d.\n", ""));
        let marked = block().set(&left, Some(RULES)).unwrap();
        assert_eq!(block().unmarked(&marked, ours).unwrap(), (marked.clone(), vec![]), "a block claims nothing");
        assert_eq!(block().unmarked(KUBEADM, ours).unwrap(), (KUBEADM.to_string(), vec![]));
    }

    #[test]
    fn setting_is_idempotent_replace_changes_only_the_block_and_remove_restores_the_original_bytes() {
        let once = block().set(KUBEADM, Some(RULES)).unwrap();
        assert_eq!(block().set(&once, Some(RULES)).unwrap(), once, "idempotent");
        let fewer = block()
            .set(&once, Some("rewrite name exact kcp.example.com. front-proxy.kcp-system.svc.cluster.local."))
            .unwrap();
        assert_eq!(fewer.lines().count(), once.lines().count() - 1, "removing a rule removes exactly its line");
        assert_eq!(block().set(&fewer, None).unwrap(), KUBEADM, "remove gives back the original bytes");
        assert_eq!(block().set(KUBEADM, None).unwrap(), KUBEADM, "removing nothing changes nothing");
    }

    #[test]
    fn a_hand_edited_marker_note_is_put_back_and_the_block_keeps_its_indentation() {
        let once = block().set(KUBEADM, Some(RULES)).unwrap();
        let edited = once.replace("(managed by kcp-keeper: edits inside this block are overwritten)", "hands off");
        let edited = edited.replace("    rewrite name exact kcp.example.com.", "  rewrite name exact kcp.example.com.");
        assert_eq!(block().set(&edited, Some(RULES)).unwrap(), once);
    }

    #[test]
    fn other_server_blocks_comments_and_quoted_braces_do_not_confuse_it() {
        let text = "# a comment with { braces }\nexample.org:53 {\n  whoami\n}\n\n. {$DNS_PORT} dns://.:53 {\n\t# }\n\tfile \"/a }{ b\"\n\tforward . 1.1.1.1\n}\n";
        let out = block().set(text, Some("rewrite name exact a.example. b.svc.cluster.local.")).unwrap();
        assert!(
            out.ends_with(
                "\tforward . 1.1.1.1\n\t# kcp-keeper:begin dns-rewriter (managed by kcp-keeper: edits inside this block are overwritten)\n\trewrite name exact a.example. b.svc.cluster.local.\n\t# kcp-keeper:end dns-rewriter\n}\n"
            ),
            "inserted into the dns://.:53 block with its tab indentation: {out}"
        );
        assert!(out.starts_with("# a comment with { braces }\nexample.org:53 {\n  whoami\n}\n"));
    }

    #[test]
    fn ambiguous_input_is_refused() {
        let once = block().set(KUBEADM, Some(RULES)).unwrap();
        let begin = once.lines().find(|l| l.contains("kcp-keeper:begin")).unwrap().to_string();
        let end = "    # kcp-keeper:end dns-rewriter";
        type Expected = fn(&BlockError) -> bool;
        let cases: Vec<(String, Expected)> = vec![
            (once.replacen(&begin, &format!("{begin}\n{begin}"), 1), |e| matches!(e, BlockError::DuplicateBegin(2, _))),
            (once.replacen(end, &format!("{end}\n{end}"), 1), |e| matches!(e, BlockError::DuplicateEnd(2, _))),
            (once.replacen(end, "", 1), |e| matches!(e, BlockError::Unterminated(..))),
            (once.replacen(&begin, "", 1), |e| matches!(e, BlockError::EndWithoutBegin(..))),
            (format!("{end}\n{}", once.replacen(end, "", 1)), |e| matches!(e, BlockError::EndWithoutBegin(..))),
            (format!("{begin}\n{end}\n{KUBEADM}"), |e| matches!(e, BlockError::OutsideServerBlock(..))),
            (KUBEADM.replace(".:53", "example.org:53"), |e| matches!(e, BlockError::NoServerBlock(_))),
            (format!("{KUBEADM}.:53 {{\n  whoami\n}}\n"), |e| matches!(e, BlockError::AmbiguousServerBlock(2, _))),
            (".:53 {\n    errors }\n".to_string(), |e| matches!(e, BlockError::ClosingBraceNotAlone(..))),
            (".:53{\n    errors\n}\n".to_string(), |e| matches!(e, BlockError::AmbiguousBrace(..))),
            (KUBEADM.replacen("    }\n", "", 1), |e| matches!(e, BlockError::Unbalanced(_))),
        ];
        for (text, expected) in cases {
            let err = block().set(&text, Some(RULES)).expect_err(&text);
            assert!(expected(&err), "unexpected error {err:?} for:\n{text}");
        }
    }

    #[test]
    fn content_that_could_break_the_next_read_or_the_server_block_is_refused() {
        let err = block().set(KUBEADM, Some("# kcp-keeper:end dns-rewriter")).unwrap_err();
        assert_eq!(err, BlockError::ContentHasMarker);
        assert_eq!(block().set(KUBEADM, Some("hosts {")).unwrap_err(), BlockError::ContentUnbalanced);
        assert_eq!(block().set(KUBEADM, Some("}")).unwrap_err(), BlockError::ContentUnbalanced);
        assert!(MarkedBlock::new("DNS rewriter", ".:53").is_err());
    }

    const SERVERS: &str = "kcp.example.com:53 {\n    forward . 10.96.0.10\n}";

    #[test]
    fn a_top_level_block_goes_at_the_end_outside_every_server_block_and_removal_restores_the_bytes() {
        let top = MarkedBlock::top_level("dns-rewriter").unwrap();
        let out = top.set(KUBEADM, Some(SERVERS)).unwrap();
        assert_eq!(
            &out[KUBEADM.len()..],
            "# kcp-keeper:begin dns-rewriter (managed by kcp-keeper: edits inside this block are overwritten)\nkcp.example.com:53 {\n    forward . 10.96.0.10\n}\n# kcp-keeper:end dns-rewriter\n"
        );
        assert_eq!(top.content(&out).unwrap().as_deref(), Some(SERVERS));
        assert_eq!(top.set(&out, Some(SERVERS)).unwrap(), out, "idempotent");
        let more = format!("{out}example.org:53 {{\n    whoami\n}}\n");
        let replaced = top.set(&more, Some("a.example.com:53 {\n    forward . 10.96.0.10\n}")).unwrap();
        assert_eq!(top.set(&replaced, None).unwrap(), format!("{KUBEADM}example.org:53 {{\n    whoami\n}}\n"));
        assert_eq!(top.unmarked(&out, |_| true).unwrap(), (out.clone(), vec![]), "nothing is claimed at the top level");
    }

    #[test]
    fn a_top_level_block_inside_a_server_block_or_after_an_unterminated_line_is_refused() {
        let top = MarkedBlock::top_level("dns-rewriter").unwrap();
        let inside = block().set(KUBEADM, Some("whoami")).unwrap();
        assert_eq!(top.set(&inside, Some(SERVERS)).unwrap_err(), BlockError::InsideServerBlock("dns-rewriter".into()));
        assert_eq!(top.set(KUBEADM.trim_end(), Some(SERVERS)).unwrap_err(), BlockError::NoFinalNewline);
        assert!(matches!(top.set(".:53 {\n", Some(SERVERS)).unwrap_err(), BlockError::Unbalanced(_)));
        assert_eq!(top.set("", Some(SERVERS)).unwrap().lines().count(), 5, "an empty text takes the block");
    }

    #[test]
    fn another_owners_block_is_not_ours() {
        let theirs = MarkedBlock::new("other", ".:53").unwrap();
        let with_theirs = theirs.set(KUBEADM, Some("whoami")).unwrap();
        let both = block().set(&with_theirs, Some(RULES)).unwrap();
        assert_eq!(theirs.content(&both).unwrap().as_deref(), Some("whoami"));
        assert_eq!(block().set(&both, None).unwrap(), with_theirs);
    }
}
