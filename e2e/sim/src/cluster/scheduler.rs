//! The simulated kube-scheduler: an independent, pure implementation of the filters (resources,
//! nodeSelector, required node affinity, taints/tolerations, required pod anti-affinity on
//! hostname) and scores (preferred node affinity, PreferNoSchedule taints, least allocated).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::selector::LabelSelector;

/// Parses a Kubernetes quantity (`500m`, `2`, `1.5Gi`, `128974848`, `1e3`) into base units.
pub fn quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suf, mul) in suffixes {
        if let Some(num) = s.strip_suffix(suf) {
            return num.parse::<f64>().ok().map(|n| n * mul);
        }
    }
    s.parse::<f64>().ok()
}

fn qv(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => quantity(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// Resources a pod requests (containers' requests, limits standing in for missing requests;
/// init containers count by their maximum), plus one `pods`.
pub fn pod_requests(pod: &Value) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let per = |c: &Value| -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        if let Some(l) = c.pointer("/resources/limits").and_then(Value::as_object) {
            for (k, v) in l {
                if let Some(q) = qv(v) {
                    m.insert(k.clone(), q);
                }
            }
        }
        if let Some(r) = c.pointer("/resources/requests").and_then(Value::as_object) {
            for (k, v) in r {
                if let Some(q) = qv(v) {
                    m.insert(k.clone(), q);
                }
            }
        }
        m
    };
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for (k, v) in per(c) {
            *out.entry(k).or_default() += v;
        }
    }
    for c in pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for (k, v) in per(c) {
            let e = out.entry(k).or_default();
            if v > *e {
                *e = v;
            }
        }
    }
    out.insert("pods".into(), 1.0);
    out
}

/// What the scheduler knows of one node.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub name: String,
    pub labels: serde_json::Map<String, Value>,
    pub taints: Vec<Value>,
    pub unschedulable: bool,
    pub ready: bool,
    pub allocatable: BTreeMap<String, f64>,
    pub requested: BTreeMap<String, f64>,
    /// Labels and namespaces of the pods on the node, for anti-affinity.
    pub pods: Vec<(String, serde_json::Map<String, Value>)>,
}

impl NodeInfo {
    pub fn from_node(node: &Value) -> Self {
        let ready = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            });
        let allocatable = node
            .pointer("/status/allocatable")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| qv(v).map(|q| (k.clone(), q)))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            name: node
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            labels: node
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            taints: node
                .pointer("/spec/taints")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            unschedulable: node.pointer("/spec/unschedulable").and_then(Value::as_bool)
                == Some(true),
            ready,
            allocatable,
            requested: BTreeMap::new(),
            pods: Vec::new(),
        }
    }

    /// Accounts a pod bound to this node.
    pub fn add_pod(&mut self, pod: &Value) {
        for (k, v) in pod_requests(pod) {
            *self.requested.entry(k).or_default() += v;
        }
        let ns = pod
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.pods.push((
            ns,
            pod.pointer("/metadata/labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        ));
    }
}

/// Whether `tolerations` tolerate `taint`.
pub fn tolerates(tolerations: &[Value], taint: &Value) -> bool {
    let tk = taint.get("key").and_then(Value::as_str).unwrap_or("");
    let tv = taint.get("value").and_then(Value::as_str).unwrap_or("");
    let te = taint.get("effect").and_then(Value::as_str).unwrap_or("");
    tolerations.iter().any(|t| {
        let key = t.get("key").and_then(Value::as_str).unwrap_or("");
        let op = t.get("operator").and_then(Value::as_str).unwrap_or("Equal");
        let val = t.get("value").and_then(Value::as_str).unwrap_or("");
        let eff = t.get("effect").and_then(Value::as_str).unwrap_or("");
        (eff.is_empty() || eff == te)
            && (key.is_empty() && op == "Exists" || key == tk)
            && (op == "Exists" || val == tv)
    })
}

fn term_matches(term: &Value, node: &NodeInfo) -> bool {
    let exprs = term
        .get("matchExpressions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let fields = term
        .get("matchFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let check = |e: &Value, get: &dyn Fn(&str) -> Option<String>| -> bool {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let op = e.get("operator").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let v = get(key);
        match op {
            "In" => v.is_some_and(|v| values.contains(&v.as_str())),
            "NotIn" => !v.is_some_and(|v| values.contains(&v.as_str())),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            "Gt" | "Lt" => {
                let (Some(a), Some(b)) = (
                    v.and_then(|v| v.parse::<i64>().ok()),
                    values.first().and_then(|b| b.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if op == "Gt" { a > b } else { a < b }
            }
            _ => false,
        }
    };
    let label = |k: &str| {
        node.labels
            .get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let field = |k: &str| {
        if k == "metadata.name" {
            Some(node.name.clone())
        } else {
            None
        }
    };
    exprs.iter().all(|e| check(e, &label)) && fields.iter().all(|e| check(e, &field))
}

/// Why a pod does not fit a node (the scheduler's words).
/// What the filters need of a pod, computed once per pod rather than once per node.
pub struct PodFacts {
    pub requests: BTreeMap<String, f64>,
    pub tolerations: Vec<Value>,
}

impl PodFacts {
    pub fn of(pod: &Value) -> Self {
        Self {
            requests: pod_requests(pod),
            tolerations: pod
                .pointer("/spec/tolerations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        }
    }
}

pub fn filter(pod: &Value, node: &NodeInfo) -> Result<(), &'static str> {
    filter_with(pod, &PodFacts::of(pod), node)
}

fn filter_with(pod: &Value, facts: &PodFacts, node: &NodeInfo) -> Result<(), &'static str> {
    let tolerations = &facts.tolerations;
    if !node.ready {
        return Err("node(s) were not ready");
    }
    if node.unschedulable {
        let t =
            serde_json::json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
        if !tolerates(tolerations, &t) {
            return Err("node(s) were unschedulable");
        }
    }
    for t in &node.taints {
        let eff = t.get("effect").and_then(Value::as_str).unwrap_or("");
        if (eff == "NoSchedule" || eff == "NoExecute") && !tolerates(tolerations, t) {
            return Err("node(s) had untolerated taint");
        }
    }
    if let Some(sel) = pod.pointer("/spec/nodeSelector").and_then(Value::as_object) {
        for (k, v) in sel {
            if node.labels.get(k) != Some(v) {
                return Err("node(s) didn't match Pod's node affinity/selector");
            }
        }
    }
    if let Some(terms) = pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
        && !terms.iter().any(|t| term_matches(t, node))
    {
        return Err("node(s) didn't match Pod's node affinity/selector");
    }
    for (k, v) in &facts.requests {
        if *v <= 0.0 {
            continue;
        }
        let alloc =
            node.allocatable
                .get(k)
                .copied()
                .unwrap_or(if k == "pods" { 110.0 } else { 0.0 });
        let used = node.requested.get(k).copied().unwrap_or(0.0);
        if used + v > alloc + 1e-9 {
            return Err(match k.as_str() {
                "cpu" => "Insufficient cpu",
                "memory" => "Insufficient memory",
                "pods" => "Too many pods",
                _ => "Insufficient resources",
            });
        }
    }
    let pod_ns = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    for term in pod
        .pointer("/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if term.get("topologyKey").and_then(Value::as_str) != Some("kubernetes.io/hostname") {
            continue;
        }
        let Ok(sel) = LabelSelector::from_object(term.get("labelSelector")) else {
            continue;
        };
        let namespaces: Vec<&str> = term
            .get("namespaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let clash = node.pods.iter().any(|(ns, labels)| {
            (if namespaces.is_empty() {
                ns == pod_ns
            } else {
                namespaces.contains(&ns.as_str())
            }) && sel.matches(Some(labels))
        });
        if clash {
            return Err("node(s) didn't match pod anti-affinity rules");
        }
    }
    Ok(())
}

/// Higher is better.
pub fn score(pod: &Value, node: &NodeInfo) -> f64 {
    score_with(pod, &PodFacts::of(pod), node)
}

fn score_with(pod: &Value, facts: &PodFacts, node: &NodeInfo) -> f64 {
    let mut s = 0.0;
    for p in pod
        .pointer("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(term) = p.get("preference")
            && term_matches(term, node)
        {
            s += p.get("weight").and_then(Value::as_f64).unwrap_or(0.0) * 1000.0;
        }
    }
    let tolerations = &facts.tolerations;
    let soft = node
        .taints
        .iter()
        .filter(|t| {
            t.get("effect").and_then(Value::as_str) == Some("PreferNoSchedule")
                && !tolerates(tolerations, t)
        })
        .count();
    s -= soft as f64 * 500.0;
    let mut free = 0.0;
    for r in ["cpu", "memory"] {
        let a = node.allocatable.get(r).copied().unwrap_or(0.0);
        if a > 0.0 {
            free += 1.0 - node.requested.get(r).copied().unwrap_or(0.0) / a;
        }
    }
    s + free * 50.0
}

/// Picks a node for `pod`, or explains why none fits (`0/3 nodes are available: ...`).
pub fn pick(pod: &Value, nodes: &[NodeInfo]) -> Result<usize, String> {
    let mut best: Option<(usize, f64)> = None;
    let mut reasons: HashMap<&'static str, usize> = HashMap::new();
    let facts = PodFacts::of(pod);
    for (i, n) in nodes.iter().enumerate() {
        match filter_with(pod, &facts, n) {
            Ok(()) => {
                let sc = score_with(pod, &facts, n);
                if best.is_none_or(|(_, b)| sc > b) {
                    best = Some((i, sc));
                }
            }
            Err(r) => *reasons.entry(r).or_default() += 1,
        }
    }
    match best {
        Some((i, _)) => Ok(i),
        None => {
            let mut rs: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
            rs.sort();
            Err(format!(
                "0/{} nodes are available: {}.",
                nodes.len(),
                rs.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct N(Value);
    fn node(name: &str) -> N {
        N(
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}}),
        )
    }
    impl N {
        fn label(mut self, k: &str, v: &str) -> Self {
            self.0["metadata"]["labels"][k] = json!(v);
            self
        }
        fn taint(mut self, k: &str, effect: &str) -> Self {
            self.0["spec"] = json!({"taints": [{"key": k, "effect": effect}]});
            self
        }
        fn info(&self) -> NodeInfo {
            NodeInfo::from_node(&self.0)
        }
    }
    struct P(Value);
    fn pod(name: &str) -> P {
        P(
            json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {}}}]}}),
        )
    }
    impl P {
        fn cpu(mut self, c: &str) -> Self {
            self.0["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!(c);
            self
        }
        fn selector(mut self, k: &str, v: &str) -> Self {
            self.0["spec"]["nodeSelector"] = json!({k: v});
            self
        }
        fn tolerate(mut self, k: &str) -> Self {
            self.0["spec"]["tolerations"] = json!([{"key": k, "operator": "Exists"}]);
            self
        }
        fn anti_affinity(mut self) -> Self {
            self.0["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}]}});
            self
        }
        fn prefer(mut self, k: &str, v: &str, w: i64) -> Self {
            self.0["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": w, "preference": {"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]}}]}});
            self
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("1Gi"), Some(1073741824.0));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("1k"), Some(1000.0));
        assert_eq!(quantity("x"), None);
    }

    #[test]
    fn resources_fit_and_report() {
        let mut n = node("n1").info();
        n.add_pod(&pod("a").cpu("3").0);
        assert_eq!(filter(&pod("b").cpu("1").0, &n), Ok(()));
        assert_eq!(
            filter(&pod("b").cpu("1500m").0, &n),
            Err("Insufficient cpu")
        );
        let err = pick(&pod("b").cpu("2").0, &[n]).unwrap_err();
        assert_eq!(err, "0/1 nodes are available: 1 Insufficient cpu.");
    }

    #[test]
    fn selectors_taints_and_anti_affinity() {
        let a = node("a").label("pool", "x").info();
        let b = node("b").taint("dedicated", "NoSchedule").info();
        assert!(filter(&pod("p").selector("pool", "x").0, &a).is_ok());
        assert!(filter(&pod("p").selector("pool", "y").0, &a).is_err());
        assert!(filter(&pod("p").0, &b).is_err());
        assert!(filter(&pod("p").tolerate("dedicated").0, &b).is_ok());
        let mut c = node("c").info();
        c.add_pod(&pod("other").0);
        assert_eq!(
            filter(&pod("p").anti_affinity().0, &c),
            Err("node(s) didn't match pod anti-affinity rules")
        );
    }

    #[test]
    fn preferred_affinity_and_soft_taints_steer() {
        let nodes = vec![node("a").info(), node("b").label("zone", "z1").info()];
        assert_eq!(pick(&pod("p").prefer("zone", "z1", 10).0, &nodes), Ok(1));
        let nodes = vec![
            node("a").taint("soft", "PreferNoSchedule").info(),
            node("b").info(),
        ];
        assert_eq!(pick(&pod("p").0, &nodes), Ok(1));
    }
}
