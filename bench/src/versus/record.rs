//! The versus run's results on disk: one JSON file per scenario, column and threshold, written
//! as each finishes, so that an interrupted run resumes where it stopped and a partial run still
//! leaves figures.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::{Column, Outcome, Scaler};

/// One measured cell, as written to its file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub scenario: String,
    pub column: Column,
    /// `ebb (Karpenter nodes)`, with the threshold when it is not the default.
    pub column_name: String,
    /// ebb's `utilizationThreshold` or Cluster Autoscaler's
    /// `--scale-down-utilization-threshold`; none for Karpenter, which has no threshold.
    pub threshold: Option<f64>,
    /// The settings line the column ran with.
    pub settings: String,
    /// The commit of the tree the bench was built from (`-dirty` when it had changes).
    pub commit: Option<String>,
    pub started: String,
    pub finished: String,
    pub outcome: Outcome,
}

/// Where results go: `EBB_VERSUS_OUT`, else `target/versus` in the workspace.
pub fn dir() -> PathBuf {
    std::env::var_os("EBB_VERSUS_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
                .join("versus")
        })
}

/// The threshold a column is measured at: `threshold` for the scalers that have one.
pub fn threshold_of(column: Column, threshold: f64) -> Option<f64> {
    match column.scaler {
        Scaler::Ebb | Scaler::ClusterAutoscaler => Some(threshold),
        Scaler::Karpenter => None,
    }
}

/// `mixed-60--ebb-karpenter--t0.7.json`; `mixed-60--karpenter.json`.
pub fn file_name(scenario: &str, column: Column, threshold: Option<f64>) -> String {
    match threshold {
        Some(t) => format!("{scenario}--{}--t{t}.json", column.key()),
        None => format!("{scenario}--{}.json", column.key()),
    }
}

/// The cell's earlier result in `dir`, when it ran (a cell that could not run is tried again).
pub fn load(
    dir: &Path,
    scenario: &str,
    column: Column,
    threshold: Option<f64>,
) -> anyhow::Result<Option<Record>> {
    let path = dir.join(file_name(scenario, column, threshold));
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let record: Record = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a versus result; move it away to run the cell again",
            path.display()
        )
    })?;
    Ok(matches!(record.outcome, Outcome::Ran(_)).then_some(record))
}

/// Writes `record` to its file in `dir` (whole or not at all: through a temporary file).
pub fn save(dir: &Path, record: &Record) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(file_name(&record.scenario, record.column, record.threshold));
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(record)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The commit the bench's sources are at, `-dirty` appended when the tree has changes; `None`
/// outside a git checkout.
pub fn commit() -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}-dirty") } else { head })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::versus::{Measured, Nodes};

    fn record(outcome: Outcome) -> Record {
        Record {
            scenario: "mixed-60".into(),
            column: Column::new(Scaler::Ebb, Nodes::Karpenter),
            column_name: "ebb (Karpenter nodes)".into(),
            threshold: Some(0.7),
            settings: "s".into(),
            commit: None,
            started: "a".into(),
            finished: "b".into(),
            outcome,
        }
    }

    #[test]
    fn a_cell_that_ran_is_loaded_back_and_one_that_did_not_is_run_again() {
        let dir = std::env::temp_dir().join(format!("ebb-versus-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let column = Column::new(Scaler::Ebb, Nodes::Karpenter);
        assert!(load(&dir, "mixed-60", column, Some(0.7)).unwrap().is_none());
        let m = Measured {
            nodes_before: 60,
            nodes_after: 31,
            node_deletes: 29,
            ..Measured::default()
        };
        save(&dir, &record(Outcome::Ran(Box::new(m)))).unwrap();
        let back = load(&dir, "mixed-60", column, Some(0.7)).unwrap().unwrap();
        let Outcome::Ran(m) = back.outcome else {
            panic!("not ran")
        };
        assert_eq!(
            (m.nodes_before, m.nodes_after, m.node_deletes),
            (60, 31, 29)
        );
        // another threshold is another cell
        assert!(load(&dir, "mixed-60", column, Some(1.0)).unwrap().is_none());
        save(&dir, &record(Outcome::NotRun("no binary".into()))).unwrap();
        assert!(load(&dir, "mixed-60", column, Some(0.7)).unwrap().is_none());
        std::fs::write(dir.join(file_name("mixed-60", column, Some(0.7))), "{").unwrap();
        assert!(load(&dir, "mixed-60", column, Some(0.7)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
