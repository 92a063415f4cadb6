//! The Karpenter-provisioned variant of a scenario: the same node count, sizes and workload, but
//! the nodes are NodeClaims of one NodePool that Karpenter's KWOK provider launched, and Karpenter
//! runs throughout.
//!
//! The nodes are NodeClaims the bench creates directly ([`karpenter::create_node_claims`]), as
//! Karpenter's provisioner writes them (the NodePool as owner, its labels, requirements and hash
//! annotations): Karpenter launches them and treats them as the pool's. That gives exactly N
//! nodes in one step. Provisioning them with N placeholder pods (one per node by anti-affinity)
//! and removing the pods works too (`karpenter::provision`), but leaves N empty nodes for a moment
//! and depends on how Karpenter batches the pending pods. While the workload is put on the nodes
//! the NodePool has `consolidateAfter: Never` and a CPU limit of exactly the N nodes, so Karpenter
//! neither removes a node nor launches one. At the start of a run ([`start`]) the limit goes and
//! `consolidateAfter` becomes the run's (the `unneededTime`) for a Karpenter run, or stays `Never`
//! for an ebb run (Karpenter then only terminates the NodeClaims ebb deletes).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::versus::Settings;
use crate::versus::observe::Budget as PdbBudget;
use crate::versus::scenario::{self, GROUP, GROUP_LABEL, NAMESPACE, Scenario};
use ebb_e2e::harness::TestEnv;
use ebb_e2e::karpenter::{self, Budget, Consolidation, Karpenter, PoolSpec};

/// The NodePool (and KWOKNodeClass) of the variant; its nodes carry [`GROUP_LABEL`]` = `[`GROUP`]
/// too, so that ebb's policy and the bench's node count select them as they select kwok nodes.
pub const POOL: &str = GROUP;

/// The label the KWOK provider sets to the NodeClaim's name (a kubelet, to its host's name).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Karpenter as both Karpenter-variant runs start it: every flag at Karpenter's default (the
/// provisioner's batch windows 1 s idle and 10 s at most, log level info, default feature gates),
/// except what running outside a pod needs (no leader election, free metrics and health ports)
/// and, for a shaped scenario, `instance_types`: the file of its KWOK instance types
/// ([`instance_types_json`]).
pub fn karpenter_settings(instance_types: Option<&std::path::Path>) -> karpenter::Settings {
    karpenter::Settings {
        batch_idle: Duration::from_secs(1),
        batch_max: Duration::from_secs(10),
        extra_args: instance_types
            .map(|p| vec![format!("--instance-types-file-path={}", p.display())])
            .unwrap_or_default(),
        ..karpenter::Settings::default()
    }
}

/// The KWOK provider's instance types of a shaped scenario (`--instance-types-file-path`, which
/// replaces its built-in ones): one per shape, named by it, with its cpu, memory, GPUs and 110
/// pods, offered on demand in the harness's zone at the shape's price per hour.
pub fn instance_types_json(s: &Scenario) -> serde_json::Value {
    let types: Vec<serde_json::Value> = s
        .shapes
        .iter()
        .map(|shape| {
            let mut resources = json!({"cpu": shape.cpu, "memory": shape.memory, "pods": "110"});
            if shape.gpus > 0 {
                resources[scenario::GPU_RESOURCE] = json!(shape.gpus.to_string());
            }
            json!({
                "name": shape.name,
                "offerings": [{"Price": shape.per_hour, "Available": true, "Requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In",
                        "values": [karpenter::CAPACITY_TYPE]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In",
                        "values": [karpenter::ZONE]}]}],
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": resources,
            })
        })
        .collect();
    json!(types)
}

/// The instance types of the scenario's nodes: its shapes' names, or the one built-in type of
/// its uniform nodes.
fn instance_types(s: &Scenario) -> anyhow::Result<Vec<String>> {
    if s.shapes.is_empty() {
        return Ok(vec![instance_type(s.node_cpu, s.node_memory)?]);
    }
    Ok(s.shapes.iter().map(|sh| sh.name.to_string()).collect())
}

/// CPUs of all the scenario's nodes.
fn total_cpus(s: &Scenario) -> anyhow::Result<u64> {
    if s.shapes.is_empty() {
        let cpus: u64 = s.node_cpu.parse()?;
        return Ok(cpus * s.nodes as u64);
    }
    let mut total = 0;
    for sh in &s.shapes {
        let cpus: u64 = sh
            .cpu
            .parse()
            .with_context(|| format!("shape {}: cpu {} is not a whole number", sh.name, sh.cpu))?;
        total += cpus * sh.count as u64;
    }
    Ok(total)
}

/// The KWOK provider's instance type for a scenario node of `cpu` and `memory`: family `c`, `s`
/// or `m` by 2, 4 or 8 GiB per CPU, then the CPU count (`s-4x-amd64-linux` for 4 cpu and 16Gi).
/// Its allocatable is the instance's less Karpenter's kube-reserved 100m cpu and 10Mi, and it
/// takes 16 pods per CPU (the scenario's kwok nodes take 110).
pub fn instance_type(cpu: &str, memory: &str) -> anyhow::Result<String> {
    let cpus: u64 = cpu
        .parse()
        .with_context(|| format!("node cpu {cpu} is not a whole number"))?;
    let gib: u64 = memory
        .strip_suffix("Gi")
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("node memory {memory} is not in Gi"))?;
    let per_cpu = gib.checked_div(cpus).filter(|_| gib.is_multiple_of(cpus));
    let family = match per_cpu {
        Some(2) => "c",
        Some(4) => "s",
        Some(8) => "m",
        _ => bail!("the KWOK provider has no instance type of {cpu} cpu and {memory}"),
    };
    Ok(format!("{family}-{cpus}x-amd64-linux"))
}

/// The variant's NodePool: [`instance_type`] of the scenario's nodes, on-demand in one zone (the
/// harness's pins), `WhenEmptyOrUnderutilized` with `consolidate_after`, one budget of
/// `maxScaleDownParallelism` nodes, the [`GROUP_LABEL`] on its nodes, and `limits` when given.
fn pool_spec(
    s: &Scenario,
    settings: &Settings,
    consolidate_after: &str,
    limits: bool,
) -> anyhow::Result<PoolSpec> {
    let mut p = PoolSpec::new(POOL);
    p.consolidation_policy = Consolidation::WhenEmptyOrUnderutilized;
    p.consolidate_after = consolidate_after.into();
    p.budgets = vec![Budget::nodes(
        &settings.max_scale_down_parallelism.to_string(),
    )];
    p.instance_types = instance_types(s)?;
    p.labels = json!({GROUP_LABEL: GROUP});
    if limits {
        p.limits = Some(json!({"cpu": total_cpus(s)?.to_string()}));
    }
    Ok(p)
}

/// What [`build`] set up.
pub struct Built {
    pub karpenter: Karpenter,
    pub budgets: Vec<PdbBudget>,
    /// The NodeClaims, in the order of their nodes' names.
    pub node_claims: Vec<String>,
    /// The nodes, by name (the first `light_from` got the busy workloads).
    pub nodes: Vec<String>,
    /// What the nodes are, for the output: instance type and allocatable.
    pub description: String,
}

/// Installs Karpenter's CRDs on `env`'s fresh cluster, starts Karpenter, creates the NodePool
/// (`consolidateAfter: Never`, limited to the scenario's nodes), `s.nodes` NodeClaims of it, and
/// once they are Ready the scenario's workload on their nodes ([`scenario::build_on`]). With
/// `hostname_is_name`, each Node's `kubernetes.io/hostname` label (the NodeClaim's name, as the
/// KWOK provider sets it) becomes the Node's name first. Fails when Karpenter launched any other
/// node or a workload pod runs elsewhere.
pub async fn build(
    env: &TestEnv,
    s: &Scenario,
    settings: &Settings,
    hostname_is_name: bool,
) -> anyhow::Result<Built> {
    let client = &env.client;
    karpenter::install_crds(env).await?;
    let types_file = match s.shapes.is_empty() {
        true => None,
        false => {
            let real = env
                .real()
                .context("Karpenter's nodes need a control plane the suite starts")?;
            let path = real.dir().join("instance-types.json");
            std::fs::write(&path, serde_json::to_vec_pretty(&instance_types_json(s))?)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Some(path)
        }
    };
    let k = Karpenter::start(env, &karpenter_settings(types_file.as_deref())).await?;
    karpenter::node_pool(client, &pool_spec(s, settings, "Never", true)?).await?;
    karpenter::wait_node_pool_ready(client, POOL, Duration::from_secs(60)).await?;
    // (shape index, NodeClaim): the nodes are ordered by shape as the scenario lists them.
    let mut created: Vec<(usize, String)> = Vec::new();
    if s.shapes.is_empty() {
        for c in karpenter::create_node_claims(client, POOL, s.nodes).await? {
            created.push((0, c));
        }
    } else {
        for (i, sh) in s.shapes.iter().enumerate() {
            for c in
                karpenter::create_node_claims_of_type(client, POOL, sh.count, Some(sh.name)).await?
            {
                created.push((i, c));
            }
        }
    }
    let names: Vec<String> = created.iter().map(|(_, c)| c.clone()).collect();
    let timeout = Duration::from_secs(60) + Duration::from_millis(500) * s.nodes as u32;
    let claims = karpenter::wait_node_claims_ready(client, &names, timeout).await?;
    let mut pairs: Vec<(usize, String, String)> = claims
        .iter()
        .zip(&created)
        .map(|(c, (shape, _))| {
            (
                *shape,
                c.node_name.clone().unwrap_or_default(),
                c.name.clone(),
            )
        })
        .collect();
    pairs.sort();
    let nodes: Vec<String> = pairs.iter().map(|p| p.1.clone()).collect();
    let node_claims: Vec<String> = pairs.iter().map(|p| p.2.clone()).collect();
    let nodes_api = Api::<Node>::all(client.clone());
    if hostname_is_name {
        for n in &nodes {
            nodes_api
                .patch(
                    n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {HOSTNAME_LABEL: n}}})),
                )
                .await
                .with_context(|| format!("relabelling node {n}"))?;
        }
    }
    let description = if s.shapes.is_empty() {
        let first = nodes_api.get(&nodes[0]).await?;
        let alloc = first
            .status
            .and_then(|st| st.allocatable)
            .unwrap_or_default();
        let q = |k: &str| alloc.get(k).map_or("?".to_string(), |v| v.0.clone());
        format!(
            "{} (allocatable cpu {}, memory {}, pods {}; the kwok variant's nodes: cpu {}, memory {}, pods 110)",
            instance_type(s.node_cpu, s.node_memory)?,
            q("cpu"),
            q("memory"),
            q("pods"),
            s.node_cpu,
            s.node_memory
        )
    } else {
        format!(
            "one per shape from the bench's instance-types file, each NodeClaim asking for its shape's ({}; allocatable 100m cpu and 10Mi less than the kwok variant's nodes)",
            s.shapes
                .iter()
                .map(|sh| format!("{} × {}", sh.count, sh.name))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let budgets = scenario::build_on(client, s, &nodes).await?;
    check(client, &nodes, &node_claims, hostname_is_name).await?;
    Ok(Built {
        karpenter: k,
        budgets,
        node_claims,
        nodes,
        description,
    })
}

/// Every NodeClaim is one of `claims` and not being deleted, every workload pod runs on one of
/// `nodes`, and with `hostname_is_name` each node's hostname label is still its name.
async fn check(
    client: &kube::Client,
    nodes: &[String],
    claims: &[String],
    hostname_is_name: bool,
) -> anyhow::Result<()> {
    let want: BTreeSet<&String> = claims.iter().collect();
    let have = karpenter::node_claims(client).await?;
    let extra: Vec<&str> = have
        .iter()
        .filter(|c| !want.contains(&c.name) || c.deletion_timestamp.is_some())
        .map(|c| c.name.as_str())
        .collect();
    if have.len() != claims.len() || !extra.is_empty() {
        bail!(
            "Karpenter's NodeClaims changed while the workload was set up: {} instead of {} ({extra:?} new or deleting)",
            have.len(),
            claims.len()
        );
    }
    if hostname_is_name {
        for n in Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
        {
            let name = n.metadata.name.clone().unwrap_or_default();
            let label = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(HOSTNAME_LABEL));
            if label != Some(&name) {
                bail!("node {name}'s {HOSTNAME_LABEL} label is {label:?} again");
            }
        }
    }
    let nodes: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items;
    let elsewhere: Vec<String> = pods
        .iter()
        .filter(|p| {
            !p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| nodes.contains(n))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    if !elsewhere.is_empty() {
        bail!(
            "{} workload pods are not on the NodeClaims' nodes: {:?}",
            elsewhere.len(),
            &elsewhere[..elsewhere.len().min(10)]
        );
    }
    Ok(())
}

/// Starts a run on the variant: for a Karpenter run (`consolidate`), sets every NodeClaim's
/// `status.lastPodEventTime` to `now` (so that `consolidateAfter` counts from the run's start, as
/// ebb's `unneededTime` counts from its first scan, and not from when setup put the pods there),
/// then re-applies the NodePool without its limit and with `consolidateAfter` = `unneededTime`;
/// for an ebb run, without its limit and still `Never`.
pub async fn start(
    client: &kube::Client,
    s: &Scenario,
    settings: &Settings,
    node_claims: &[String],
    consolidate: bool,
    now: &jiff::Timestamp,
) -> anyhow::Result<()> {
    let after = if consolidate {
        let t = now.to_string();
        for c in node_claims {
            karpenter::set_last_pod_event_time(client, c, &t).await?;
        }
        format!("{}s", settings.unneeded_time.as_secs())
    } else {
        "Never".to_string()
    };
    karpenter::node_pool(client, &pool_spec(s, settings, &after, false)?).await
}

/// Karpenter's disruption decisions in its log (`disrupting node(s)`), counted by reason and
/// decision: `Underutilized delete ×3 (12 nodes)`, one entry per kind.
pub fn commands(log: &str) -> Vec<String> {
    let mut by: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["message"] != "disrupting node(s)" {
            continue;
        }
        let cmd = v["command"].as_str().unwrap_or_default();
        // "Underutilized/<id>: delete: nodepools=[pool]: [node, node] (savings: $0.23)", or
        // "...: replace: nodepools=[pool]: [node] -> [1 replacement] (savings: ...)"
        let reason = cmd.split('/').next().unwrap_or("?");
        let decision = cmd.split(": ").nth(1).unwrap_or("?");
        let nodes = cmd
            .split_once("]: [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map_or(0, |(l, _)| {
                l.split(',').filter(|n| !n.trim().is_empty()).count()
            });
        let e = by.entry(format!("{reason} {decision}")).or_default();
        e.0 += 1;
        e.1 += nodes;
    }
    by.into_iter()
        .map(|(k, (n, nodes))| format!("{k} ×{n} ({nodes} nodes)"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_types_match_the_scenarios_nodes() {
        assert_eq!(instance_type("4", "16Gi").unwrap(), "s-4x-amd64-linux");
        assert_eq!(instance_type("8", "32Gi").unwrap(), "s-8x-amd64-linux");
        assert_eq!(instance_type("2", "4Gi").unwrap(), "c-2x-amd64-linux");
        assert_eq!(instance_type("4", "32Gi").unwrap(), "m-4x-amd64-linux");
        assert!(instance_type("4", "10Gi").is_err());
    }

    #[test]
    fn a_shaped_scenario_has_one_priced_instance_type_per_shape() {
        let s = scenario::gpu_pool();
        let types = instance_types_json(&s);
        let types = types.as_array().unwrap();
        assert_eq!(types.len(), s.shapes.len());
        for (t, sh) in types.iter().zip(&s.shapes) {
            assert_eq!(t["name"], sh.name);
            assert_eq!(t["resources"]["cpu"], sh.cpu);
            assert_eq!(t["offerings"][0]["Price"], sh.per_hour);
            let gpus = t["resources"].get(scenario::GPU_RESOURCE);
            assert_eq!(gpus.is_some(), sh.gpus > 0, "{t}");
        }
        assert_eq!(
            instance_types(&s).unwrap(),
            vec!["gpu-8x", "gpu-4x", "gpu-2x", "cpu-32x"]
        );
        assert_eq!(total_cpus(&s).unwrap(), 3 * 64 + 5 * 32 + 8 * 16 + 12 * 32);
        assert_eq!(
            instance_types(&scenario::mixed_60()).unwrap(),
            vec!["s-4x-amd64-linux"]
        );
    }

    #[test]
    fn disruption_commands_are_counted_by_reason() {
        let log = concat!(
            r#"{"level":"INFO","message":"disrupting node(s)","command":"Empty/a: delete: nodepools=[pool]: [n1, n2] (savings: $0.23)"}"#,
            "\n",
            r#"{"level":"INFO","message":"tainted node"}"#,
            "\n",
            r#"{"level":"INFO","message":"disrupting node(s)","command":"Underutilized/b: replace: nodepools=[pool]: [n3] -> [1 replacement] (savings: $0.01)"}"#,
            "\n",
            r#"{"level":"INFO","message":"disrupting node(s)","command":"Empty/c: delete: nodepools=[pool]: [n4]"}"#,
        );
        assert_eq!(
            commands(log),
            vec![
                "Empty delete ×2 (3 nodes)",
                "Underutilized replace ×1 (1 nodes)"
            ]
        );
    }
}
