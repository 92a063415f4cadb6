//! No file of any crate of the workspace imports a file that imports it back, directly or through
//! others: per crate, the file-level graph of its `src/` (`use crate::…`, `use super::…` and
//! `use self::…` lines, and paths such as `crate::a::f()` or `super::b::T` in code; comments and
//! test modules left out) has no cycle. A cycle is printed with the files in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `dir`, by module path (`a/b.rs` and `a/b/mod.rs` are `[a, b]`).
fn modules(root: &Path, dir: &Path, out: &mut BTreeMap<Module, PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        panic!("cannot read {}", dir.display());
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.strip_prefix(root).is_ok_and(|r| r == Path::new("bin")) {
                continue;
            }
            modules(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            if p.strip_prefix(root)
                .is_ok_and(|r| r == Path::new("main.rs"))
            {
                continue;
            }
            let rel = p.strip_prefix(root).unwrap_or(&p).with_extension("");
            let mut parts: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts
                .last()
                .is_some_and(|l| matches!(l.as_str(), "mod" | "lib" | "main"))
            {
                parts.pop();
            }
            out.insert(parts, p);
        }
    }
}

/// The paths a `use` body names, with braces expanded (`a::{b, c::{d, e}}`).
fn expand(body: &str) -> Vec<String> {
    let Some(open) = body.find('{') else {
        return vec![body.to_string()];
    };
    let prefix = &body[..open];
    let inner = body[open + 1..]
        .strip_suffix('}')
        .unwrap_or(&body[open + 1..]);
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    parts.push(cur);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// A file's text before its test module, with `//` comments (and doc comments) blanked.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `crate::…`, `super::…` and `self::…` paths written in code outside `use` lines
/// (`crate::setup::f(x)`, `super::status::Status { .. }`, `$crate::harness::Backend`).
fn inline_paths(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start).map(|i| from + i) {
            from = i + start.len();
            if i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':') {
                continue;
            }
            let mut end = i;
            while end < bytes.len() && (ident(bytes[end]) || bytes[end] == b':') {
                end += 1;
            }
            // `super::{a, b}` and `super::*` are `use` lines, read by `use_bodies`.
            let path = code[i..end].trim_end_matches(':');
            if path.contains("::") {
                out.push(path.to_string());
            }
            from = end;
        }
    }
    out
}

/// Every path a file names: its `use` lines, braces expanded, and the paths in its code.
fn import_paths(text: &str) -> Vec<String> {
    let code = code(text);
    let mut out: Vec<String> = use_bodies(&code).iter().flat_map(|b| expand(b)).collect();
    out.extend(inline_paths(&code));
    out
}

/// The `use` bodies of a file's text before its test module, whitespace removed.
fn use_bodies(text: &str) -> Vec<String> {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("use ") {
        let line_start = rest[..i].rfind('\n').map_or(0, |n| n + 1);
        let lead = rest[line_start..i].trim();
        let is_use = lead.is_empty() || lead.starts_with("pub");
        let after = &rest[i + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if is_use {
            out.push(after[..end].split_whitespace().collect::<String>());
        }
        rest = &after[end.min(after.len())..];
    }
    out
}

/// The file a path resolves to: its longest prefix that is a file.
fn resolve(files: &BTreeMap<Module, PathBuf>, path: &[String]) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|i| path[..i].to_vec())
        .find(|m| files.contains_key(m))
}

fn graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = BTreeMap::new();
    modules(src, src, &mut files);
    let mut edges = BTreeMap::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut targets = BTreeSet::new();
        {
            for u in import_paths(&text) {
                let segs: Vec<String> = u.split("::").map(str::to_string).collect();
                let path: Vec<String> = match segs.first().map(String::as_str) {
                    Some("crate") => segs[1..].to_vec(),
                    Some("super") => {
                        let mut base = module.clone();
                        let mut i = 0;
                        while segs.get(i).is_some_and(|s| s == "super") {
                            base.pop();
                            i += 1;
                        }
                        base.extend(segs[i..].iter().cloned());
                        base
                    }
                    Some("self") => {
                        let mut base = module.clone();
                        base.extend(segs[1..].iter().cloned());
                        base
                    }
                    _ => continue,
                };
                if let Some(t) = resolve(&files, &path)
                    && &t != module
                {
                    targets.insert(t);
                }
            }
        }
        edges.insert(module.clone(), targets);
    }
    edges
}

/// Groups of files that reach each other (strongly connected, more than one file).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<BTreeSet<Module>> {
    let reach = |from: &Module| -> BTreeSet<Module> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for t in edges.get(&m).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&Module, BTreeSet<Module>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut groups: Vec<BTreeSet<Module>> = Vec::new();
    for (m, r) in &reaches {
        if !r.contains(*m) || groups.iter().any(|g| g.contains(*m)) {
            continue;
        }
        let group: BTreeSet<Module> = r
            .iter()
            .filter(|o| reaches.get(o).is_some_and(|ro| ro.contains(*m)))
            .cloned()
            .collect();
        groups.push(group);
    }
    groups
}

#[test]
fn the_parser_sees_super_crate_and_braced_imports() {
    let text = "use std::fmt;\npub(crate) use super::a::{B, c::{D, E}};\nuse crate::x::Y;\n\
                let s = \"use of\";\n#[cfg(test)]\nmod tests {\n use crate::z;\n}";
    let bodies = use_bodies(text);
    let all: Vec<String> = bodies.iter().flat_map(|b| expand(b)).collect();
    assert!(all.contains(&"super::a::c::D".to_string()), "{all:?}");
    assert!(all.contains(&"super::a::B".to_string()), "{all:?}");
    assert!(all.contains(&"crate::x::Y".to_string()), "{all:?}");
    assert!(
        !all.iter().any(|a| a.contains('z')),
        "test modules are left out: {all:?}"
    );
}

#[test]
fn paths_in_code_count_and_comments_do_not() {
    let text = "fn f() -> super::status::Status {\n    crate::setup::steering_args(b, n, a)?;\n\
                let x = $crate::harness::Backend::Sim;\n    my_crate::other::g();\n}\n\
                /// see [`crate::documented::Only`]\nlet y = 1; // crate::trailing::Comment\n\
                pub(in crate::agent) struct S;\n";
    let all = import_paths(text);
    for want in [
        "super::status::Status",
        "crate::setup::steering_args",
        "crate::harness::Backend::Sim",
        "crate::agent",
    ] {
        assert!(all.iter().any(|a| a == want), "{want} in {all:?}");
    }
    assert!(
        !all.iter()
            .any(|a| a.contains("other") || a.contains("documented") || a.contains("trailing")),
        "{all:?}"
    );
}

#[test]
fn a_cycle_of_three_files_is_found() {
    let m = |s: &str| vec![s.to_string()];
    let edges = BTreeMap::from([
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("c")])),
        (m("c"), BTreeSet::from([m("a")])),
        (m("d"), BTreeSet::from([m("a")])),
    ]);
    let found = cycles(&edges);
    assert_eq!(found, vec![BTreeSet::from([m("a"), m("b"), m("c")])]);
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The workspace's members, as the root Cargo.toml lists them.
fn members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("cannot read the workspace's Cargo.toml: {e}"));
    let start = manifest
        .find("members")
        .and_then(|i| manifest[i..].find('[').map(|j| i + j + 1))
        .unwrap_or_else(|| panic!("no `members = [...]` in the workspace's Cargo.toml"));
    let end = manifest[start..]
        .find(']')
        .map(|j| start + j)
        .unwrap_or_else(|| panic!("`members = [` is not closed in the workspace's Cargo.toml"));
    manifest[start..end]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The binary roots of a crate (`src/main.rs`, `src/bin/*.rs`), which the graph leaves out:
/// nothing imports them, so they can be in a cycle only through modules of their own
/// ([`check_binary_modules`]).
fn binary_roots(src: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(src.join("bin"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    out.push(src.join("main.rs"));
    out.retain(|p| p.is_file());
    out
}

/// A binary root's own modules must be files under `src/` named by `#[path]` (as
/// `e2e/src/bin/ebb-demo.rs` takes `src/demo/`): the graph reads them there, at the module path
/// `crate::` gives them in the binary. Any other `mod` in a binary root fails the test, which
/// would not see it.
fn check_binary_modules(src: &Path, bin: &Path) {
    let text = std::fs::read_to_string(bin)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", bin.display()));
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line
            .strip_prefix("pub ")
            .unwrap_or(line)
            .strip_prefix("mod ")
            .and_then(|r| r.strip_suffix(';'))
        else {
            continue;
        };
        let target = i
            .checked_sub(1)
            .and_then(|j| lines[j].strip_prefix("#[path = \""))
            .and_then(|r| r.strip_suffix("\"]"))
            .map(|p| bin.parent().unwrap_or(src).join(p));
        let expected = [
            src.join(name).join("mod.rs"),
            src.join(format!("{name}.rs")),
        ];
        let ok = target.as_ref().is_some_and(|t| {
            expected
                .iter()
                .any(|e| t.canonicalize().ok() == e.canonicalize().ok() && e.is_file())
        });
        assert!(
            ok,
            "{}: `mod {name};` is a module of the binary this test does not read; put it at \
             src/{name}/mod.rs or src/{name}.rs with #[path], or teach the test",
            bin.display()
        );
    }
}

#[test]
fn no_file_of_any_crate_imports_one_that_imports_it_back() {
    let root = repo_root();
    let members = members(&root);
    assert!(
        members.len() >= 7,
        "read the workspace's members: {members:?}"
    );
    let mut files = 0;
    let mut found_all = vec![];
    for member in &members {
        let src = root.join(member).join("src");
        assert!(src.is_dir(), "{member} has no src/ directory");
        for bin in binary_roots(&src) {
            check_binary_modules(&src, &bin);
        }
        let edges = graph(&src);
        assert!(!edges.is_empty(), "read the files of {member}/src");
        files += edges.len();
        for group in cycles(&edges) {
            found_all.push(
                group
                    .iter()
                    .map(|m| format!("{member}/src/{}", m.join("/")))
                    .collect::<Vec<_>>(),
            );
        }
    }
    assert!(files > 150, "read the workspace's files: {files}");
    assert!(
        found_all.is_empty(),
        "files importing each other (break the circle: move what both need into a third file): \
         {found_all:#?}"
    );
}
