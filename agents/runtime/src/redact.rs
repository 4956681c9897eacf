//! URLs as they may be shown: a URL's userinfo (`https://user:password@host`) is a credential, and a URL read
//! from a configuration file or a cluster object (a RootShard's `spec.shardBaseURL`, an etcd endpoint, a
//! kubeconfig's `server:`) may carry one. Whatever prints, logs or exports such a URL (a report, a log line, an
//! Event, an error, a metric label) passes it through [`url`] first.

/// What the userinfo of a URL is shown as.
pub const REDACTED: &str = "REDACTED";

/// `url` with its userinfo, if any, replaced by [`REDACTED`]: `https://user:pw@host:6443/x` becomes
/// `https://REDACTED@host:6443/x`. A string without a scheme is read as starting at its authority
/// (`user:pw@host:2379`, how etcd endpoints and `host:port` addresses are often written). Anything that is not
/// a URL comes back unchanged unless an `@` sits where userinfo would be, which is then redacted all the same:
/// better a mangled message than a leaked password. Never panics.
pub fn url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}{REDACTED}{}", &rest[at..]),
        None => url.to_string(),
    }
}

/// `text` (an error message, a report line) with every URL in it passed through [`url`]: each `scheme://`
/// followed by userinfo has the userinfo redacted. For text built from messages of other libraries (a client
/// error that names the URL it failed on), where the URL cannot be redacted before it is written.
pub fn urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (before, after) = rest.split_at(i + 3);
        out.push_str(before);
        // The authority ends where a URL's would, or at anything that cannot be in one in running text.
        let end = after
            .find(|c: char| matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '`') || c.is_whitespace())
            .unwrap_or(after.len());
        let (authority, tail) = after.split_at(end);
        out.push_str(&url(authority));
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_replaced_and_everything_else_of_the_url_kept() {
        assert_eq!(
            url("https://admin:s3cret@kcp.example.com:6443/clusters/root"),
            "https://REDACTED@kcp.example.com:6443/clusters/root"
        );
        assert_eq!(url("http://user@etcd-0.etcd.svc:2379"), "http://REDACTED@etcd-0.etcd.svc:2379");
        assert_eq!(url("https://a:b@c@host"), "https://REDACTED@host", "the last @ of the authority ends the userinfo");
        assert_eq!(url("https://u:p@[fd00::1]:6443"), "https://REDACTED@[fd00::1]:6443");
        assert_eq!(url("user:pw@etcd.kcp.svc:2379"), "REDACTED@etcd.kcp.svc:2379", "without a scheme too");
    }

    #[test]
    fn a_url_without_userinfo_or_a_string_that_is_no_url_comes_back_unchanged() {
        for same in [
            "https://kcp.example.com:6443/clusters/root",
            "https://kcp.example.com/path@with-at",
            "https://kcp.example.com/?q=a@b",
            "https://h#frag@x",
            "etcd.kcp.svc:2379",
            "",
            "://",
            "not a url",
            "héllo wörld",
        ] {
            assert_eq!(url(same), same);
        }
        assert_eq!(url("https://@host"), "https://REDACTED@host", "an empty userinfo is still userinfo");
    }

    #[test]
    fn every_url_in_a_text_is_redacted_and_the_rest_of_the_text_kept() {
        let text = "spec.shardBaseURL https://admin:pw1@kcp.example.com:443 is on kcp.example.com; \
                    endpoints [\"http://u:pw2@etcd-0:2379\", \"http://etcd-1:2379\"] (see https://x.example/a@b)";
        let shown = urls_in(text);
        assert!(!shown.contains("pw1") && !shown.contains("pw2"), "{shown}");
        assert_eq!(
            shown,
            "spec.shardBaseURL https://REDACTED@kcp.example.com:443 is on kcp.example.com; \
             endpoints [\"http://REDACTED@etcd-0:2379\", \"http://etcd-1:2379\"] (see https://x.example/a@b)"
        );
        assert_eq!(urls_in("no url here, user@example.com"), "no url here, user@example.com");
        assert_eq!(urls_in("trailing https://"), "trailing https://");
    }
}
