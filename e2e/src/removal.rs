//! Helpers of the machine-removal tests on the real backend: a policy's status and Events,
//! counters from `/metrics`, Karpenter NodeClaims beside the provisioned ones, abandoned drains.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ebb_api::{ScaleDownPolicy, ScaleDownPolicyStatus};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::karpenter;

/// Deletes the NodeClaims of `pool` other than `keep`, and waits until they and their Nodes are
/// gone. `karpenter::provision` can leave one more node than it reports: when kube-controller-
/// manager's taint-eviction controller deletes a pod just bound to a fresh node, its
/// replacement gets a node of its own and the first stays, empty. Returns the names deleted.
pub async fn drop_extra_node_claims(
    client: &kube::Client,
    pool: &str,
    keep: &[String],
) -> Vec<String> {
    let extra: Vec<_> = karpenter::node_claims(client)
        .await
        .expect("NodeClaims")
        .into_iter()
        .filter(|x| x.pool.as_deref() == Some(pool) && !keep.contains(&x.name))
        .collect();
    for x in &extra {
        eprintln!(
            "an extra NodeClaim {} (node {:?}) beside the provisioned ones: deleting it",
            x.name, x.node_name
        );
        karpenter::delete_node_claim(client, &x.name)
            .await
            .expect("delete the extra NodeClaim");
    }
    for x in &extra {
        let node = x.node_name.clone().unwrap_or_default();
        karpenter::wait_gone(client, &x.name, &node, Duration::from_secs(30))
            .await
            .expect("the extra NodeClaim gone");
    }
    extra.into_iter().map(|x| x.name).collect()
}

/// The drains the controller abandoned because its re-check no longer found the node
/// removable, from its log: (node, reason), in order.
pub fn abandoned_drains(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter(|l| l.contains("drain abandoned") && l.contains("NoLongerRemovable"))
        .filter_map(|l| {
            let node = l.split(" node=").nth(1)?.split([' ', '}']).next()?;
            let reason = l.rsplit("reason=").next().unwrap_or_default();
            Some((node.to_string(), reason.trim().to_string()))
        })
        .collect()
}

/// Why drains were abandoned, for the failure message: lists the nodes whose
/// `kubernetes.io/hostname` label is not their name (Karpenter labels a node with its
/// NodeClaim's name), which a re-check by label would miss.
pub async fn abandoned_diagnosis(
    client: &kube::Client,
    abandoned: &[(String, String)],
    nodes: &BTreeSet<String>,
) -> String {
    let mut mismatched = Vec::new();
    for n in nodes {
        let Ok(Some(node)) = Api::<Node>::all(client.clone()).get_opt(n).await else {
            continue;
        };
        let host = node
            .metadata
            .labels
            .unwrap_or_default()
            .get("kubernetes.io/hostname")
            .cloned()
            .unwrap_or_default();
        if host != *n {
            mismatched.push(format!("{n} has kubernetes.io/hostname={host}"));
        }
    }
    let drains = abandoned
        .iter()
        .map(|(n, r)| format!("{n}: {r}"))
        .collect::<Vec<_>>()
        .join("\n  ");
    let cause = if mismatched.is_empty() {
        String::new()
    } else {
        format!(
            "\nthe drain's re-check must find a node by its name (scaledown::recheck), not by its \
             kubernetes.io/hostname label, which Karpenter sets to the NodeClaim's name; nodes \
             whose hostname label is not their name:\n  {}",
            mismatched.join("\n  ")
        )
    };
    format!(
        "ebb abandoned {} drains as no longer removable, so none finishes:\n  {drains}{cause}",
        abandoned.len()
    )
}

pub async fn policy_status(client: &kube::Client, name: &str) -> Option<ScaleDownPolicyStatus> {
    Some(
        Api::<ScaleDownPolicy>::all(client.clone())
            .get(name)
            .await
            .ok()?
            .status
            .unwrap_or_default(),
    )
}

/// Events (events.k8s.io) on policy `policy` with `reason`: the node each concerns (its
/// `related` object) → its note.
pub async fn policy_events(
    client: &kube::Client,
    policy: &str,
    reason: &str,
) -> BTreeMap<String, String> {
    Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(policy))
        .map(|e| {
            let node = e
                .related
                .and_then(|r| r.name)
                .unwrap_or_else(|| "<no related object>".into());
            (node, e.note.unwrap_or_default())
        })
        .collect()
}

/// The samples of counter `name` in Prometheus text: the labels (`k=v` sorted, joined by `,`)
/// → the value.
pub fn counters(text: &str, name: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        let mut pairs: Vec<String> = labels
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.replace('"', ""))
            .collect();
        pairs.sort();
        let value = value.split_whitespace().next().and_then(|v| v.parse().ok());
        if let Some(v) = value {
            out.insert(pairs.join(","), v);
        }
    }
    out
}
