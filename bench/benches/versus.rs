//! ebb against Cluster Autoscaler and Karpenter on the same real control plane, one fresh cluster
//! per scenario and column: `cargo bench -p ebb-bench --bench versus` (see docs/performance.md, "Versus
//! Cluster Autoscaler and Karpenter").
//!
//! Needs the control plane (`e2e/k8s/build.sh`), the peers (`e2e/k8s/build.sh peers`: Karpenter,
//! and Cluster Autoscaler from `EBB_CA_SOURCE`, see e2e/k8s/README.md) and the
//! controller (`cargo build --release -p ebb-controller`). `EBB_VERSUS_SCENARIOS` picks scenarios
//! by name (comma-separated: mixed-60, pdb-paced, large-200, tight-holes, gpu-pool); all by default.
//! `EBB_VERSUS_COLUMNS` picks columns (comma-separated: ebb, cluster-autoscaler, ebb-karpenter,
//! ebb-karpenter-hostname, karpenter); all but ebb-karpenter-hostname by default.
//! `EBB_VERSUS_UTILIZATION_THRESHOLD` (a comma-separated list) runs ebb's columns and Cluster
//! Autoscaler's once per threshold (ebb's `utilizationThreshold`, Cluster Autoscaler's
//! `--scale-down-utilization-threshold`; ebb's default alone when unset). Each cell's result is
//! written to its own JSON file in `EBB_VERSUS_OUT` (default `target/versus`) as it finishes; a
//! run started again keeps the cells already there and runs the others (`EBB_VERSUS_FRESH=1` runs
//! every cell again), then prints every table and the summary lines (also written to
//! `summary.txt` there). `EBB_CA_BIN` names the Cluster Autoscaler binary (else
//! `cluster-autoscaler` in the control plane's bin dir); `EBB_VERSUS_CA_WINDOW` its fixed window
//! in seconds; `EBB_VERSUS_LOG_DIR` where the scalers' logs are kept (ebb's too, at
//! `EBB_VERSUS_EBB_LOG_FILTER`, default `warn`).

use ebb_bench::versus::{self, Column, Outcome, Settings, karpenter_nodes, record, scenario};

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

fn list(var: &str) -> Option<Vec<String>> {
    std::env::var(var).ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

async fn run() -> anyhow::Result<()> {
    let wanted = list("EBB_VERSUS_SCENARIOS");
    let columns: Vec<Column> = match list("EBB_VERSUS_COLUMNS") {
        None => Column::ALL
            .into_iter()
            .filter(|c| c.nodes != versus::Nodes::KarpenterHostnameIsName)
            .collect(),
        Some(keys) => Column::ALL
            .into_iter()
            .filter(|c| keys.contains(&c.key()))
            .collect(),
    };
    let scenarios = [
        scenario::mixed_60(),
        scenario::pdb_paced(24),
        scenario::large_200(),
        scenario::tight_holes(),
        scenario::gpu_pool(),
    ];
    let thresholds = versus::thresholds_from_env()?;
    let default = versus::ebb_default_threshold();
    let out = record::dir();
    let fresh = std::env::var_os("EBB_VERSUS_FRESH").is_some();
    let commit = record::commit();
    eprintln!(
        "versus: results in {} ({}), commit {}",
        out.display(),
        if fresh {
            "EBB_VERSUS_FRESH: every cell runs again"
        } else {
            "cells already there are kept: delete a file, or set EBB_VERSUS_FRESH=1, to run it again"
        },
        commit.as_deref().unwrap_or("unknown")
    );
    let mut summaries = Vec::new();
    let mut ebb_columns = Vec::new();
    let mut settings_lines = std::collections::BTreeSet::new();
    let mut commits = std::collections::BTreeSet::new();
    let chosen: Vec<&scenario::Scenario> = scenarios
        .iter()
        .filter(|s| {
            wanted
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == s.name))
        })
        .collect();
    // Every cell, in table order: (scenario, name, column, threshold).
    let mut cells: Vec<(usize, String, Column, Option<f64>)> = Vec::new();
    for si in 0..chosen.len() {
        for &column in &columns {
            let per_column: Vec<Option<f64>> = match record::threshold_of(column, default) {
                Some(_) => thresholds.iter().map(|t| Some(*t)).collect(),
                None => vec![None],
            };
            for threshold in per_column {
                let name = match threshold {
                    Some(t) if thresholds.len() > 1 || t != default => {
                        format!("{} at {t}", column.name())
                    }
                    _ => column.name(),
                };
                cells.push((si, name, column, threshold));
            }
        }
    }
    // Run order: Cluster Autoscaler's fixed windows last, so that a partial run has every
    // other column.
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&i| (cells[i].2.scaler == versus::Scaler::ClusterAutoscaler, i));
    let mut outcomes: Vec<Option<Outcome>> = vec![None; cells.len()];
    for i in order {
        let (si, name, column, threshold) = &cells[i];
        let (s, column, threshold) = (chosen[*si], *column, *threshold);
        let settings = Settings {
            utilization_threshold: threshold.unwrap_or(default),
            ..Settings::default()
        };
        let earlier = match fresh {
            true => None,
            false => record::load(&out, s.name, column, threshold)?,
        };
        let rec = match earlier {
            Some(r) => {
                eprintln!(
                    "versus {} / {name}: kept from {} (commit {})",
                    s.name,
                    r.finished,
                    r.commit.as_deref().unwrap_or("unknown")
                );
                r
            }
            None => {
                let started = jiff::Timestamp::now();
                let t = std::time::Instant::now();
                let outcome = match versus::run_on(s, column, &settings).await {
                    Ok(o) => o,
                    Err(e) => Outcome::NotRun(format!("failed: {e:#}")),
                };
                eprintln!(
                    "versus {} / {name} ({:.0} s): {outcome:?}",
                    s.name,
                    t.elapsed().as_secs_f64()
                );
                let r = record::Record {
                    scenario: s.name.to_string(),
                    column,
                    column_name: name.clone(),
                    threshold,
                    settings: column.settings_line(&settings),
                    commit: commit.clone(),
                    started: started.to_string(),
                    finished: jiff::Timestamp::now().to_string(),
                    outcome,
                };
                let path = record::save(&out, &r)?;
                eprintln!("versus {} / {name}: written to {}", s.name, path.display());
                r
            }
        };
        settings_lines.insert(rec.settings.clone());
        commits.insert(format!(
            "{} / {name}: commit {}, {} to {}",
            s.name,
            rec.commit.as_deref().unwrap_or("unknown"),
            rec.started,
            rec.finished
        ));
        outcomes[i] = Some(rec.outcome);
    }
    for (si, s) in chosen.iter().enumerate() {
        let mine: Vec<(String, Column, Option<f64>, Outcome)> = cells
            .iter()
            .zip(&outcomes)
            .filter(|((i, ..), _)| *i == si)
            .filter_map(|((_, n, c, t), o)| o.clone().map(|o| (n.clone(), *c, *t, o)))
            .collect();
        let named: Vec<(String, Outcome)> = mine
            .iter()
            .map(|(n, _, _, o)| (n.clone(), o.clone()))
            .collect();
        println!("{}", versus::table(s, &named));
        // The summary lines compare the scalers at ebb's default threshold.
        let at_default: Vec<(Column, Outcome)> = mine
            .iter()
            .filter(|(_, _, t, _)| t.is_none_or(|t| t == default))
            .map(|(_, c, _, o)| (*c, o.clone()))
            .collect();
        summaries.push(versus::summary_line(s, &at_default));
        summaries.extend(versus::kwok_summary_line(s, &at_default));
        ebb_columns.push((s.name, versus::summary_ebb_column(&at_default)));
    }
    println!("Cells (commit, start and end):");
    for c in &commits {
        println!("- {c}");
    }
    println!("Settings:");
    for l in &settings_lines {
        println!("- {l}");
    }
    println!(
        "- Karpenter nodes: NodeClaims of one NodePool and KWOKNodeClass `{}`, created directly as \
         Karpenter's provisioner writes them and launched by Karpenter; the KWOK provider's \
         instance type of the scenario's node size, on-demand, zone test-zone-a (see each table)",
        karpenter_nodes::POOL
    );
    println!();
    for (name, c) in &ebb_columns {
        println!(
            "The summary line's ebb figures for {name} are from {} at utilizationThreshold {default}.",
            c.name()
        );
    }
    let mut text = String::new();
    for l in &summaries {
        println!("{l}");
        text.push_str(l);
        text.push('\n');
    }
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("summary.txt"), text)?;
    Ok(())
}
