//! No file of `controller/src` imports a file that imports it back, directly or through others:
//! the file-level graph of `use crate::…`, `use super::…` and `use self::…` lines (test modules
//! left out) has no cycle. A cycle is printed with the files in it.

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
            modules(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
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
        for body in use_bodies(&text) {
            for u in expand(&body) {
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

#[test]
fn no_file_of_the_controller_imports_one_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    assert!(
        edges.len() > 50,
        "read the controller's files: {}",
        edges.len()
    );
    let found = cycles(&edges);
    let shown: Vec<Vec<String>> = found
        .iter()
        .map(|g| g.iter().map(|m| m.join("/")).collect())
        .collect();
    assert!(
        found.is_empty(),
        "files importing each other (break the circle: move what both need into a third file): \
         {shown:#?}"
    );
}
