//! The defaults the docs state are the code's: every row of a docs table with a `flag` and a
//! `default` column against the clap definition of its binary's `run` (the node agent's in
//! docs/node-agent.md, the controller's elsewhere), every row of a table with a `value` and a
//! `default` column against charts/ebb/values.yaml. Every flag of both `run`s is in such a table.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every `docs/*.md`, as (path relative to the root, text).
fn docs() -> Vec<(String, String)> {
    let dir = repo_root().join("docs");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .path()
        })
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("md"))
        .map(|p| {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            let rel = format!("docs/{name}");
            let text = read(&rel);
            (rel, text)
        })
        .collect();
    out.sort();
    out
}

/// A Markdown table outside code blocks: its header cells and its rows with their line numbers.
#[derive(Debug)]
struct Table {
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h.trim() == name)
    }
}

/// The cells of a table row: split at `|` outside code spans and not escaped as `\|`.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = vec![];
    let mut cell = String::new();
    let mut in_code = false;
    let mut prev = ' ';
    for c in inner.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                cell.push(c);
            }
            '|' if !in_code && prev != '\\' => out.push(std::mem::take(&mut cell)),
            _ => cell.push(c),
        }
        prev = c;
    }
    out.push(cell);
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

fn tables(text: &str) -> Vec<Table> {
    let mut out: Vec<Table> = vec![];
    let mut fence = false;
    let mut current: Option<Table> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fence = !fence;
        }
        if fence || !t.starts_with('|') {
            out.extend(current.take());
            continue;
        }
        match &mut current {
            None => {
                current = Some(Table {
                    header: cells(t),
                    rows: vec![],
                })
            }
            Some(table) => {
                let row = cells(t);
                let separator = row
                    .iter()
                    .all(|c| !c.is_empty() && c.chars().all(|ch| "-:".contains(ch)));
                if !separator {
                    table.rows.push((i + 1, row));
                }
            }
        }
    }
    out.extend(current);
    out
}

/// The contents of the code spans of a cell, in order.
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// One default as a doc writes it.
#[derive(Debug, PartialEq)]
enum Stated {
    /// In a code span, or a bare number, `true`/`false` or size such as `10 GiB`.
    Value(String),
    /// Words: "none", "required", "the host name", "off", ...
    Prose(String),
}

/// The defaults of a `default` cell: parts separated by `, ` outside code spans, each without a
/// trailing parenthesis or words after its code span (`ebb-steering` in `--namespace`).
fn stated(cell: &str) -> Vec<Stated> {
    let mut parts = vec![];
    let mut part = String::new();
    let mut in_code = false;
    let mut depth = 0usize;
    let chars: Vec<char> = cell.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        match c {
            '`' => in_code = !in_code,
            '(' if !in_code => depth += 1,
            ')' if !in_code => depth = depth.saturating_sub(1),
            ',' if !in_code && depth == 0 && chars.get(i + 1) == Some(&' ') => {
                parts.push(std::mem::take(&mut part));
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    parts.push(part);
    parts
        .into_iter()
        .map(|p| {
            let p = p.trim();
            if p.starts_with('`') {
                return Stated::Value(code_spans(p).into_iter().next().unwrap_or_default());
            }
            let words = match p.find(" (") {
                Some(k) => p[..k].trim(),
                None => p,
            };
            if words.parse::<f64>().is_ok()
                || words == "true"
                || words == "false"
                || bytes(words).is_some()
            {
                Stated::Value(words.to_string())
            } else {
                Stated::Prose(words.to_string())
            }
        })
        .collect()
}

/// `10 GiB`, `512 MiB` or a plain number of bytes.
fn bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Some(n);
    }
    let (n, unit) = s.split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let shift = match unit {
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return None,
    };
    Some(n << shift)
}

/// Whether a documented value is the code's: equal as text, as a byte size or as a duration.
fn same(doc: &str, code: &str) -> bool {
    if doc == code {
        return true;
    }
    if let (Some(a), Some(b)) = (bytes(doc), bytes(code)) {
        return a == b;
    }
    match (
        doc.parse::<ebb_api::KubeDuration>(),
        code.parse::<ebb_api::KubeDuration>(),
    ) {
        (Ok(a), Ok(b)) => a.0 == b.0,
        _ => false,
    }
}

/// Pairs a row's keys with its stated defaults: one each, or one default for all keys.
fn pair<'a>(
    keys: &'a [String],
    defaults: &'a [Stated],
) -> Result<Vec<(&'a String, &'a Stated)>, String> {
    if defaults.len() == keys.len() {
        Ok(keys.iter().zip(defaults).collect())
    } else if defaults.len() == 1 {
        Ok(keys.iter().map(|k| (k, &defaults[0])).collect())
    } else {
        Err(format!(
            "{} keys ({}) but {} defaults",
            keys.len(),
            keys.join(", "),
            defaults.len()
        ))
    }
}

/// A flag of a binary's `run` as clap defines it.
struct Flag {
    default: Option<String>,
    env: Option<String>,
}

fn run_flags(cmd: clap::Command) -> std::collections::BTreeMap<String, Flag> {
    let run = cmd
        .find_subcommand("run")
        .unwrap_or_else(|| panic!("{} has no `run` subcommand", cmd.get_name()))
        .clone();
    run.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            let defaults: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            Some((
                format!("--{long}"),
                Flag {
                    default: (!defaults.is_empty()).then(|| defaults.join(",")),
                    env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
                },
            ))
        })
        .filter(|(name, _)| name != "--help" && name != "--version")
        .collect()
}

/// What is wrong with the flag rows of one docs table, and which flags it documents.
fn check_flag_table(
    file: &str,
    table: &Table,
    flags: &std::collections::BTreeMap<String, Flag>,
    binary: &str,
) -> (Vec<String>, BTreeSet<String>) {
    let mut problems = vec![];
    let mut seen = BTreeSet::new();
    let Some(default_col) = table.column("default") else {
        return (problems, seen);
    };
    let env_col = table.column("env");
    for (line, row) in &table.rows {
        let at = format!("{file}:{line}");
        let Some(first) = row.first() else { continue };
        let spans = code_spans(first);
        let names: Vec<String> = spans
            .iter()
            .filter(|s| s.starts_with("--"))
            .cloned()
            .collect();
        // The node agent's table names the variable in the flag cell: `--x` (`EBB_X`).
        let mut envs: Vec<String> = spans
            .iter()
            .filter(|s| !s.starts_with("--"))
            .cloned()
            .collect();
        if let Some(c) = env_col {
            envs = row.get(c).map(|c| code_spans(c)).unwrap_or_default();
        }
        if names.is_empty() {
            problems.push(format!("{at}: no `--flag` in the first cell `{first}`"));
            continue;
        }
        for (i, name) in names.iter().enumerate() {
            seen.insert(name.clone());
            let Some(flag) = flags.get(name) else {
                problems.push(format!("{at}: {name} is not a flag of `{binary} run`"));
                continue;
            };
            if let Some(env) = envs.get(i)
                && flag.env.as_deref() != Some(env.as_str())
            {
                problems.push(format!(
                    "{at}: {name}'s variable is documented as {env}, the code reads {}",
                    flag.env.as_deref().unwrap_or("none")
                ));
            }
        }
        let cell = row.get(default_col).map(String::as_str).unwrap_or("");
        let defaults = stated(cell);
        let pairs = match pair(&names, &defaults) {
            Ok(p) => p,
            Err(e) => {
                problems.push(format!("{at}: default cell `{cell}`: {e}"));
                continue;
            }
        };
        for (name, doc) in pairs {
            let Some(flag) = flags.get(name) else {
                continue;
            };
            match (doc, &flag.default) {
                (Stated::Value(d), Some(c)) if same(d, c) => {}
                (Stated::Value(d), code) => problems.push(format!(
                    "{at}: {name} defaults to `{d}` in the docs, to {} in `{binary} run`",
                    code.as_deref()
                        .map_or("nothing".to_string(), |c| format!("`{c}`"))
                )),
                (Stated::Prose(_), None) => {}
                (Stated::Prose(p), Some(c)) => problems.push(format!(
                    "{at}: {name}'s default is \"{p}\" in the docs, but `{binary} run` has the fixed default `{c}`: write it"
                )),
            }
        }
    }
    (problems, seen)
}

#[test]
fn every_documented_flag_default_is_the_code_s_and_every_flag_is_documented() {
    let controller = run_flags(ebb_controller::cli::args::Cli::command());
    let agent = run_flags(ebb_node_agent::cli::Cli::command());
    assert!(
        controller.len() >= 20 && agent.len() >= 15,
        "only {} controller and {} node agent flags read from clap",
        controller.len(),
        agent.len()
    );
    let mut problems = vec![];
    let mut documented_controller = BTreeSet::new();
    let mut documented_agent = BTreeSet::new();
    let mut rows = 0;
    for (file, text) in docs() {
        let (flags, binary, documented) = if file == "docs/node-agent.md" {
            (&agent, "ebb-node-agent", &mut documented_agent)
        } else {
            (&controller, "ebb-controller", &mut documented_controller)
        };
        for table in tables(&text) {
            let first = table.header.first().map(String::as_str).unwrap_or("");
            if !first.starts_with("flag") || table.column("default").is_none() {
                continue;
            }
            rows += table.rows.len();
            let (p, seen) = check_flag_table(&file, &table, flags, binary);
            problems.extend(p);
            documented.extend(seen);
        }
    }
    for (flags, documented, binary, file) in [
        (
            &controller,
            &documented_controller,
            "ebb-controller",
            "docs/operations.md",
        ),
        (
            &agent,
            &documented_agent,
            "ebb-node-agent",
            "docs/node-agent.md",
        ),
    ] {
        for name in flags.keys().filter(|n| !documented.contains(*n)) {
            problems.push(format!(
                "{name} of `{binary} run` is in no flag table of the docs (add it to {file})"
            ));
        }
    }
    assert!(
        rows >= 30,
        "only {rows} flag rows found in docs/; is the table parser broken?"
    );
    assert!(
        problems.is_empty(),
        "{} documented flag(s) differ from the code:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The value at a dotted path of values.yaml.
fn lookup<'a>(values: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(values, |v, k| v.get(k))
}

/// Whether a stated default describes a values.yaml value.
fn matches_value(doc: &Stated, value: &Value) -> Result<(), String> {
    let empty = match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    match doc {
        Stated::Value(d) => {
            if let Some(n) = bytes(d)
                && d.contains(' ')
            {
                return if value.as_u64() == Some(n) {
                    Ok(())
                } else {
                    Err(format!("`{d}` ({n} bytes)"))
                };
            }
            let parsed: Value =
                serde_saphyr::from_str(d).unwrap_or_else(|_| Value::String(d.clone()));
            // values.yaml's empty scalar parses as null, the docs write `""` for it.
            if parsed == *value || (d == "\"\"" && empty) {
                Ok(())
            } else {
                Err(format!("`{d}`"))
            }
        }
        Stated::Prose(p) => {
            let ok = match p.as_str() {
                // Nothing set: an empty string, list or map.
                "off" | "none" | "any" => empty,
                "link-local" => value.as_array().is_some_and(|a| {
                    !a.is_empty() && a.iter().all(|c| c == "169.254.0.0/16" || c == "fe80::/10")
                }),
                _ => return Err(format!("\"{p}\" (write the value in a code span)")),
            };
            if ok { Ok(()) } else { Err(format!("\"{p}\"")) }
        }
    }
}

/// The chart values a first cell names: `a.b.c`, and `.d` for a sibling of the key before.
fn value_keys(cell: &str) -> Vec<String> {
    let mut keys: Vec<String> = vec![];
    for span in code_spans(cell) {
        let key = match span.strip_prefix('.') {
            Some(rest) => match keys.last().and_then(|k| k.rsplit_once('.')) {
                Some((parent, _)) => format!("{parent}.{rest}"),
                None => rest.to_string(),
            },
            None => span,
        };
        keys.push(key);
    }
    keys
}

#[test]
fn every_documented_chart_value_default_is_in_values_yaml() {
    let values: Value = serde_saphyr::from_str(&read("charts/ebb/values.yaml"))
        .unwrap_or_else(|e| panic!("charts/ebb/values.yaml does not parse: {e}"));
    let mut problems = vec![];
    let mut checked = 0;
    for (file, text) in docs() {
        for table in tables(&text) {
            let first = table.header.first().map(String::as_str).unwrap_or("");
            let Some(default_col) = table.column("default") else {
                continue;
            };
            if first != "value" {
                continue;
            }
            for (line, row) in &table.rows {
                let at = format!("{file}:{line}");
                let keys = value_keys(row.first().map(String::as_str).unwrap_or(""));
                if keys.is_empty() {
                    problems.push(format!("{at}: no `value` in the first cell"));
                    continue;
                }
                let cell = row.get(default_col).map(String::as_str).unwrap_or("");
                let defaults = stated(cell);
                let pairs = match pair(&keys, &defaults) {
                    Ok(p) => p,
                    Err(e) => {
                        problems.push(format!("{at}: default cell `{cell}`: {e}"));
                        continue;
                    }
                };
                for (key, doc) in pairs {
                    checked += 1;
                    let Some(value) = lookup(&values, key) else {
                        problems.push(format!("{at}: {key} is not in charts/ebb/values.yaml"));
                        continue;
                    };
                    if let Err(said) = matches_value(doc, value) {
                        problems.push(format!(
                            "{at}: {key} defaults to {said} in the docs, to {value} in charts/ebb/values.yaml"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked >= 30,
        "only {checked} chart values found in docs/ tables; is the table parser broken?"
    );
    assert!(
        problems.is_empty(),
        "{} documented chart value(s) differ from charts/ebb/values.yaml:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The parser on the shapes the docs use.
#[test]
fn tables_and_defaults_parse_as_the_docs_write_them() {
    let md = "| flag | env | default | meaning |\n\
              |---|---|---|---|\n\
              | `--a`, `--b` | `A`, ... | `true`, none (the Service) | x \\| y `p|q` |\n\
              ```\n| not | a | table |\n```\n\
              | value | default |\n|---|---|\n| `n.fetch.allowHosts`, `.allowCIDRs` | 10 GiB, `\"\"` (this cluster) |\n";
    let t = tables(md);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(t[0].header, ["flag", "env", "default", "meaning"]);
    assert_eq!(t[0].rows.len(), 1);
    assert_eq!(t[0].rows[0].0, 3);
    assert_eq!(t[0].rows[0].1.len(), 4, "{:?}", t[0].rows[0].1);
    assert_eq!(
        stated(&t[0].rows[0].1[2]),
        [Stated::Value("true".into()), Stated::Prose("none".into())]
    );
    assert_eq!(
        value_keys(&t[1].rows[0].1[0]),
        ["n.fetch.allowHosts", "n.fetch.allowCIDRs"]
    );
    assert_eq!(
        stated(&t[1].rows[0].1[1]),
        [Stated::Value("10 GiB".into()), Stated::Value("\"\"".into())]
    );
    assert!(same("10 GiB", "10737418240"));
    assert!(same("25s", "25s"));
    assert!(!same("5s", "0s"));
    assert!(matches_value(&Stated::Value("0s".into()), &Value::String("5s".into())).is_err());
    assert!(matches_value(&Stated::Prose("off".into()), &Value::String(String::new())).is_ok());
    assert!(matches_value(&Stated::Prose("off".into()), &Value::String("x".into())).is_err());
}
