//! ebb against Cluster Autoscaler and Karpenter on the same real control plane, one fresh cluster
//! per scenario and column: `cargo bench -p ebb-bench --bench versus` (see docs/performance.md, "Versus
//! Cluster Autoscaler and Karpenter").
//!
//! Needs the control plane (`e2e/k8s/build.sh`), the peers (`e2e/k8s/build.sh peers`: Karpenter,
//! and Cluster Autoscaler from `EBB_CA_SOURCE`, see e2e/k8s/README.md) and the
//! controller (`cargo build --release -p ebb-controller`). `EBB_VERSUS_SCENARIOS` picks scenarios
//! by name (comma-separated: mixed-60, pdb-paced, large-200); all by default.
//! `EBB_VERSUS_COLUMNS` picks columns (comma-separated: ebb, cluster-autoscaler, ebb-karpenter,
//! ebb-karpenter-hostname, karpenter); all by default. `EBB_VERSUS_UTILIZATION_THRESHOLD` sets
//! ebb's `utilizationThreshold` and Cluster Autoscaler's `--scale-down-utilization-threshold`
//! (0.5 by default, the default of both). `EBB_CA_BIN` names the Cluster Autoscaler binary (else
//! `cluster-autoscaler` in the control plane's bin dir); `EBB_VERSUS_LOG_DIR` where its logs are
//! kept. Each scenario runs on kwok nodes (ebb, Cluster Autoscaler) and on Karpenter-provisioned
//! nodes of the same size (ebb removing through their NodeClaims, Karpenter).

use ebb_bench::versus::{self, Column, Outcome, Settings, karpenter_nodes, scenario};

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
        None => Column::ALL.to_vec(),
        Some(keys) => Column::ALL
            .into_iter()
            .filter(|c| keys.contains(&c.key()))
            .collect(),
    };
    let scenarios = [
        scenario::mixed_60(),
        scenario::pdb_paced(24),
        scenario::large_200(),
    ];
    let settings = Settings::from_env()?;
    let started = jiff::Timestamp::now();
    let mut summaries = Vec::new();
    let mut ebb_columns = Vec::new();
    for s in scenarios.iter().filter(|s| {
        wanted
            .as_ref()
            .is_none_or(|w| w.iter().any(|n| n == s.name))
    }) {
        let mut results = Vec::new();
        for &column in &columns {
            let t = std::time::Instant::now();
            let outcome = match versus::run_on(s, column, &settings).await {
                Ok(o) => o,
                Err(e) => Outcome::NotRun(format!("failed: {e:#}")),
            };
            eprintln!(
                "versus {} / {} ({:.0} s): {outcome:?}",
                s.name,
                column.name(),
                t.elapsed().as_secs_f64()
            );
            results.push((column, outcome));
        }
        println!("{}", versus::table(s, &results));
        summaries.push(versus::summary_line(s, &results));
        summaries.extend(versus::kwok_summary_line(s, &results));
        ebb_columns.push((s.name, versus::summary_ebb_column(&results)));
    }
    println!(
        "Run of {started} to {} on this machine; settings:",
        jiff::Timestamp::now()
    );
    for c in &columns {
        println!("- {}: {}", c.name(), c.settings_line(&settings));
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
            "The summary line's ebb figures for {name} are from {}.",
            c.name()
        );
    }
    for l in &summaries {
        println!("{l}");
    }
    Ok(())
}
