//! ebb against Cluster Autoscaler and Karpenter on the same real control plane, one fresh cluster
//! per scenario and scaler: `cargo bench -p ebb-e2e --bench versus` (see the README, Performance).
//!
//! Needs the control plane (`e2e/k8s/build.sh`), the peers (`e2e/k8s/build.sh peers`) and the
//! controller (`cargo build --release -p ebb-controller`). `EBB_VERSUS_SCENARIOS` picks scenarios
//! by name (comma-separated: mixed-60, pdb-paced, large-200); all by default.

use ebb_e2e::versus::{self, Outcome, Scaler, Settings, scenario};

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let wanted: Option<Vec<String>> = std::env::var("EBB_VERSUS_SCENARIOS").ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    });
    let scenarios = [
        scenario::mixed_60(),
        scenario::pdb_paced(24),
        scenario::large_200(),
    ];
    let settings = Settings::default();
    let started = jiff::Timestamp::now();
    let mut tables = Vec::new();
    let mut summaries = Vec::new();
    for s in scenarios.iter().filter(|s| {
        wanted
            .as_ref()
            .is_none_or(|w| w.iter().any(|n| n == s.name))
    }) {
        let mut results = Vec::new();
        for scaler in Scaler::ALL {
            let outcome = match versus::run(s, scaler, &settings).await {
                Ok(o) => o,
                Err(e) => Outcome::NotRun(format!("failed: {e:#}")),
            };
            eprintln!("versus {} / {}: {outcome:?}", s.name, scaler.name());
            results.push((scaler, outcome));
        }
        let t = versus::table(s, &results);
        println!("{t}");
        tables.push(t);
        summaries.push(versus::summary_line(s, &results));
    }
    println!("Run of {started} on this machine; settings:");
    for scaler in Scaler::ALL {
        println!("- {}", scaler.settings_line(&settings));
    }
    println!();
    for l in &summaries {
        println!("{l}");
    }
    Ok(())
}
