//! Every relative link in the repository's Markdown (README.md, docs/, e2e/k8s/README.md, ...)
//! resolves: the file exists, and a `#anchor` names a heading of the target as GitHub slugs it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// Every `*.md` under `dir`, skipping build output and hidden directories.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The text with fenced code blocks and inline code spans replaced by spaces (newlines kept, so
/// byte offsets still give line numbers).
fn prose(text: &str) -> String {
    blank_code_spans(&without_fences(text))
}

/// The text with fenced code blocks replaced by spaces (newlines kept).
fn without_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<(char, usize)> = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |m| trimmed.chars().take_while(|c| *c == m).count());
        let in_block = match (fence, marker) {
            (None, Some(m)) if run >= 3 => {
                fence = Some((m, run));
                true
            }
            (Some((m, n)), Some(c)) if c == m && run >= n && trimmed[run..].trim().is_empty() => {
                fence = None;
                true
            }
            (Some(_), _) => true,
            (None, _) => false,
        };
        if in_block {
            out.extend(line.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Inline code spans (a run of n backticks up to the next run of exactly n, within a paragraph)
/// blanked out.
fn blank_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|c| **c == '`').count();
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '\n' && chars.get(j + 1) == Some(&'\n') {
                break;
            }
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|c| **c == '`').count();
                if m == n {
                    close = Some(j + m);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                for c in &mut out[i..end] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = end;
            }
            None => i += n,
        }
    }
    out.into_iter().collect()
}

/// GitHub's heading id: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's ATX headings outside code blocks, with GitHub's `-1`, `-2`
/// suffixes for repeated ones.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = vec![];
    for line in without_fences(text).lines() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let rest = line.trim_start_matches(' ');
        let level = rest.chars().take_while(|c| *c == '#').count();
        if indent > 3 || level == 0 || level > 6 {
            continue;
        }
        let title = &rest[level..];
        if !(title.is_empty() || title.starts_with(' ')) {
            continue;
        }
        let title = title.trim().trim_end_matches('#').trim();
        let base = slug(title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of inline links and images (`[text](target "title")`) and of reference
/// definitions (`[label]: target`), each with its line number.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let text = prose(text);
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut out = vec![];
    let mut from = 0;
    while let Some(found) = text[from..].find("](") {
        let start = from + found + 2;
        let mut depth = 0usize;
        let mut end = None;
        for (k, c) in text[start..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(start + k);
                    break;
                }
                ')' => depth -= 1,
                '\n' => break,
                _ => {}
            }
        }
        if let Some(end) = end {
            let inner = text[start..end].trim();
            let target = if let Some(stripped) = inner.strip_prefix('<') {
                stripped.split('>').next().unwrap_or("")
            } else {
                inner.split_whitespace().next().unwrap_or("")
            };
            out.push((line_of(start), target.to_string()));
        }
        from = start;
    }
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix('[')
            && let Some(close) = rest.find("]:")
            && !rest[..close].is_empty()
            && !rest[..close].contains(']')
        {
            let target = rest[close + 2..].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            out.push((line_of(offset), target.to_string()));
        }
        offset += line.len();
    }
    out
}

/// A path as the failure messages show it: relative to the repository root.
fn shown(path: &Path) -> String {
    let root = repo_root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

fn is_external(target: &str) -> bool {
    let scheme = target.split(':').next().unwrap_or("");
    target.contains(':')
        && !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        && !target.starts_with('#')
        && !target.starts_with('/')
        && !target.starts_with('.')
}

/// What is wrong with one relative link of `file`, if anything.
fn check(file: &Path, target: &str, cache: &mut HashMap<PathBuf, Vec<String>>) -> Option<String> {
    if target.is_empty() {
        return Some("empty link target".to_string());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(abs) = path.strip_prefix('/') {
        repo_root().join(abs)
    } else {
        file.parent().unwrap_or(Path::new(".")).join(path)
    };
    if !dest.exists() {
        return Some(format!("`{target}`: {} does not exist", shown(&dest)));
    }
    let anchor = anchor?;
    if dest.extension().and_then(|e| e.to_str()) != Some("md") {
        return Some(format!(
            "`{target}`: an anchor into {}, which is not Markdown",
            shown(&dest)
        ));
    }
    let list = cache.entry(dest.clone()).or_insert_with(|| {
        let text = std::fs::read_to_string(&dest)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dest.display()));
        anchors(&text)
    });
    if list.iter().any(|a| a == anchor) {
        None
    } else {
        Some(format!(
            "`{target}`: no heading of {} has the anchor #{anchor}",
            shown(&dest)
        ))
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo_root();
    let mut files = vec![];
    markdown_files(&root, &mut files);
    files.sort();
    for required in ["README.md", "docs/architecture.md", "e2e/k8s/README.md"] {
        assert!(
            files.contains(&root.join(required)),
            "{required} is missing under {}",
            root.display()
        );
    }
    let mut cache = HashMap::new();
    let mut checked = 0;
    let mut broken = vec![];
    for file in &files {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        for (line, target) in link_targets(&text) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            if let Some(problem) = check(file, &target, &mut cache) {
                broken.push(format!("{}:{line}: {problem}", shown(file)));
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} relative links found in {} Markdown files; is the parser broken?",
        files.len()
    );
    assert!(
        broken.is_empty(),
        "{} broken relative link(s) out of {checked}:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Headings GitHub renders, with the ids it gives them.
#[test]
fn anchors_follow_github_slugs() {
    let md = "# ebb\n\
              ## `ebb-controller plan`\n\
              ### JSON output (`-o json`)\n\
              ### A policy loop on a real control plane at 1,000 nodes\n\
              ## Errors\n\
              ## Errors\n\
              ```sh\n\
              # not a heading\n\
              ```\n\
              \x20   # indented code, not a heading\n\
              ## snake_case and Ünïcode\n";
    assert_eq!(
        anchors(md),
        [
            "ebb",
            "ebb-controller-plan",
            "json-output--o-json",
            "a-policy-loop-on-a-real-control-plane-at-1000-nodes",
            "errors",
            "errors-1",
            "snake_case-and-ünïcode",
        ]
    );
}

/// Links in code are not links; links whose text wraps a line are.
#[test]
fn link_targets_skip_code() {
    let md = "see [the\nplan](docs/plan.md#errors) and `[x](nowhere.md)`\n\
              ```\n[y](nowhere.md)\n```\n\
              ![a picture](docs/drain-trace.svg \"title\")\n\
              [ref]: docs/install.md\n";
    let targets: Vec<String> = link_targets(md).into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        targets,
        [
            "docs/plan.md#errors",
            "docs/drain-trace.svg",
            "docs/install.md"
        ]
    );
}
