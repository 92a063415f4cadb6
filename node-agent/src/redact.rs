//! URLs as the agent reports them (logs, traces, errors, NodeState, the store): without user
//! information, query or fragment, so credentials and presigned signatures never leave the agent.

/// `url` without `user:password@`, `?query` and `#fragment`; a removed query shows as `?…`.
pub fn redact(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "<unparsable URL>".to_string();
    };
    let had_query = parsed.query().is_some();
    // Both fail only for URLs that cannot have credentials (`file:`, `data:`): nothing to remove.
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    parsed.set_query(None);
    parsed.set_fragment(None);
    let mut out = parsed.to_string();
    if had_query {
        out.push_str("?…");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_queries_and_fragments_are_removed() {
        assert_eq!(
            redact("https://user:s3cret@artifacts.example.com/a/model.bin?X-Amz-Signature=abc#f"),
            "https://artifacts.example.com/a/model.bin?…"
        );
        assert_eq!(redact("http://token@host:8080/x"), "http://host:8080/x");
        assert_eq!(
            redact("file:///srv/artifacts/m.bin"),
            "file:///srv/artifacts/m.bin"
        );
        assert_eq!(redact("not a url"), "<unparsable URL>");
        let shown = redact("https://u:p@h/p?sig=SECRET");
        assert!(
            !shown.contains("SECRET") && !shown.contains("u:p"),
            "{shown}"
        );
    }
}
