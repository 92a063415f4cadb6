//! The resource registry: which kinds the simulator serves (plural, kind, scope, subresources,
//! short names, printer columns). Built-in kinds are listed here; created CRDs are added at runtime.

use serde_json::{Value, json};

/// One printer column of a kind, as in a CRD's `additionalPrinterColumns`.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// A simple JSONPath such as `.status.phase` (no filters), or a built-in computed column
    /// starting with `@` (see `server::table`).
    pub json_path: String,
    /// 0 shows always, 1 only with `-o wide`.
    pub priority: i64,
}

/// Everything the server needs to know to serve one resource.
#[derive(Clone, Debug)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub status_subresource: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub columns: Vec<Column>,
    /// The CRD's `openAPIV3Schema` for this version, when the kind comes from a CRD.
    pub schema: Option<Value>,
    /// Whether strategic merge patch is allowed (built-in kinds only, as in Kubernetes).
    pub builtin: bool,
}

impl ResourceInfo {
    /// `apiVersion` of objects of this kind (`v1` for the core group).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (or `plural` for the core group), as used in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Verbs for discovery.
    fn verbs(&self) -> Value {
        json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ])
    }

    /// The `APIResource` entries (main resource and subresources) for discovery.
    pub fn discovery_entries(&self) -> Vec<Value> {
        let mut out = vec![json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": self.verbs(),
            "shortNames": self.short_names,
            "categories": self.categories,
        })];
        if self.status_subresource {
            out.push(json!({"name": format!("{}/status", self.plural), "singularName": "",
                "namespaced": self.namespaced, "kind": self.kind, "verbs": ["get", "patch", "update"]}));
        }
        if self.group == "apps"
            && matches!(
                self.plural.as_str(),
                "deployments" | "replicasets" | "statefulsets"
            )
        {
            out.push(
                json!({"name": format!("{}/scale", self.plural), "singularName": "",
                "namespaced": true, "group": "autoscaling", "version": "v1", "kind": "Scale",
                "verbs": ["get", "patch", "update"]}),
            );
        }
        if self.group.is_empty() && self.plural == "pods" {
            out.push(
                json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}),
            );
            out.push(
                json!({"name": "pods/binding", "singularName": "", "namespaced": true,
                "kind": "Binding", "verbs": ["create"]}),
            );
        }
        out
    }
}

fn col(name: &str, type_: &str, json_path: &str, priority: i64) -> Column {
    Column {
        name: name.to_string(),
        type_: type_.to_string(),
        json_path: json_path.to_string(),
        priority,
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    status: bool,
    short: &[&str],
    columns: Vec<Column>,
) -> ResourceInfo {
    let categories = match plural {
        "pods" | "services" | "deployments" | "replicasets" | "statefulsets" | "daemonsets"
        | "jobs" => vec!["all".to_string()],
        _ => vec![],
    };
    ResourceInfo {
        group: group.to_string(),
        version: version.to_string(),
        plural: plural.to_string(),
        singular: kind.to_lowercase(),
        kind: kind.to_string(),
        namespaced,
        status_subresource: status,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories,
        columns,
        schema: None,
        builtin: true,
    }
}

/// The built-in kinds served from start.
pub fn builtins() -> Vec<ResourceInfo> {
    let age = || col("Age", "date", ".metadata.creationTimestamp", 0);
    vec![
        builtin(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            true,
            &["ns"],
            vec![col("Status", "string", ".status.phase", 0), age()],
        ),
        builtin(
            "",
            "v1",
            "nodes",
            "Node",
            false,
            true,
            &["no"],
            vec![
                col("Status", "string", "@node-status", 0),
                col("Roles", "string", "@node-roles", 0),
                age(),
                col("Version", "string", ".status.nodeInfo.kubeletVersion", 0),
                col("Internal-IP", "string", "@node-ip", 1),
            ],
        ),
        builtin(
            "",
            "v1",
            "pods",
            "Pod",
            true,
            true,
            &["po"],
            vec![
                col("Ready", "string", "@pod-ready", 0),
                col("Status", "string", "@pod-status", 0),
                col("Restarts", "string", "@pod-restarts", 0),
                age(),
                col("IP", "string", ".status.podIP", 1),
                col("Node", "string", ".spec.nodeName", 1),
                col("Nominated Node", "string", ".status.nominatedNodeName", 1),
                col("Readiness Gates", "string", "@none", 1),
            ],
        ),
        builtin(
            "",
            "v1",
            "events",
            "Event",
            true,
            false,
            &["ev"],
            vec![
                col("Last Seen", "date", ".lastTimestamp", 0),
                col("Type", "string", ".type", 0),
                col("Reason", "string", ".reason", 0),
                col("Object", "string", "@event-object", 0),
                col("Message", "string", ".message", 0),
            ],
        ),
        builtin(
            "",
            "v1",
            "secrets",
            "Secret",
            true,
            false,
            &[],
            vec![
                col("Type", "string", ".type", 0),
                col("Data", "integer", "@data-count", 0),
                age(),
            ],
        ),
        builtin(
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            true,
            false,
            &["cm"],
            vec![col("Data", "integer", "@data-count", 0), age()],
        ),
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            false,
            &["sa"],
            vec![col("Secrets", "integer", "@secrets-count", 0), age()],
        ),
        builtin(
            "",
            "v1",
            "services",
            "Service",
            true,
            true,
            &["svc"],
            vec![
                col("Type", "string", ".spec.type", 0),
                col("Cluster-IP", "string", ".spec.clusterIP", 0),
                col("External-IP", "string", "@none", 0),
                col("Port(s)", "string", "@svc-ports", 0),
                age(),
                col("Selector", "string", "@svc-selector", 1),
            ],
        ),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            false,
            &["ev"],
            vec![
                col("Reason", "string", ".reason", 0),
                col("Note", "string", ".note", 0),
                age(),
            ],
        ),
        builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            true,
            &["pdb"],
            vec![
                col("Min Available", "string", "@pdb-min", 0),
                col("Max Unavailable", "string", "@pdb-max", 0),
                col(
                    "Allowed Disruptions",
                    "integer",
                    ".status.disruptionsAllowed",
                    0,
                ),
                age(),
            ],
        ),
        builtin(
            "apps",
            "v1",
            "replicasets",
            "ReplicaSet",
            true,
            true,
            &["rs"],
            vec![
                col("Desired", "integer", ".spec.replicas", 0),
                col("Current", "integer", ".status.replicas", 0),
                col("Ready", "integer", ".status.readyReplicas", 0),
                age(),
            ],
        ),
        builtin(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            true,
            &["deploy"],
            vec![
                col("Ready", "string", "@ready-of-replicas", 0),
                col("Up-to-date", "integer", ".status.updatedReplicas", 0),
                col("Available", "integer", ".status.availableReplicas", 0),
                age(),
            ],
        ),
        builtin(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            true,
            true,
            &["sts"],
            vec![col("Ready", "string", "@ready-of-replicas", 0), age()],
        ),
        builtin(
            "apps",
            "v1",
            "daemonsets",
            "DaemonSet",
            true,
            true,
            &["ds"],
            vec![
                col("Desired", "integer", ".status.desiredNumberScheduled", 0),
                col("Current", "integer", ".status.currentNumberScheduled", 0),
                col("Ready", "integer", ".status.numberReady", 0),
                col("Up-to-date", "integer", ".status.updatedNumberScheduled", 0),
                col("Available", "integer", ".status.numberAvailable", 0),
                age(),
            ],
        ),
        builtin(
            "batch",
            "v1",
            "jobs",
            "Job",
            true,
            true,
            &[],
            vec![
                col("Status", "string", "@job-status", 0),
                col("Completions", "string", "@job-completions", 0),
                age(),
            ],
        ),
        builtin(
            "",
            "v1",
            "persistentvolumes",
            "PersistentVolume",
            false,
            true,
            &["pv"],
            vec![
                col("Capacity", "string", ".spec.capacity.storage", 0),
                col("Status", "string", ".status.phase", 0),
                col("StorageClass", "string", ".spec.storageClassName", 0),
                age(),
            ],
        ),
        builtin(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            true,
            true,
            &["pvc"],
            vec![
                col("Status", "string", ".status.phase", 0),
                col("Volume", "string", ".spec.volumeName", 0),
                col("StorageClass", "string", ".spec.storageClassName", 0),
                age(),
            ],
        ),
        builtin(
            "storage.k8s.io",
            "v1",
            "storageclasses",
            "StorageClass",
            false,
            false,
            &["sc"],
            vec![
                col("Provisioner", "string", ".provisioner", 0),
                col("VolumeBindingMode", "string", ".volumeBindingMode", 0),
                age(),
            ],
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            false,
            &[],
            vec![col("Holder", "string", ".spec.holderIdentity", 0), age()],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            false,
            &[],
            vec![age()],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            false,
            &[],
            vec![col("Role", "string", "@roleref", 0), age()],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            false,
            &[],
            vec![age()],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            false,
            &[],
            vec![col("Role", "string", "@roleref", 0), age()],
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            true,
            &["crd", "crds"],
            vec![col("Created At", "date", ".metadata.creationTimestamp", 0)],
        ),
    ]
}

/// The kinds a CRD object declares: one [`ResourceInfo`] per served version.
pub fn from_crd(crd: &Value) -> Result<Vec<ResourceInfo>, String> {
    let spec = crd.get("spec").ok_or("CRD has no spec")?;
    let group = spec
        .get("group")
        .and_then(Value::as_str)
        .ok_or("CRD spec.group is required")?;
    let names = spec.get("names").ok_or("CRD spec.names is required")?;
    let plural = names
        .get("plural")
        .and_then(Value::as_str)
        .ok_or("CRD spec.names.plural is required")?;
    let kind = names
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("CRD spec.names.kind is required")?;
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .unwrap_or(&kind.to_lowercase())
        .to_string();
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("CRD spec.versions is required")?;
    let mut out = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or("CRD spec.versions[].name is required")?;
        let mut columns = Vec::new();
        for c in v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            columns.push(col(
                c.get("name").and_then(Value::as_str).unwrap_or(""),
                c.get("type").and_then(Value::as_str).unwrap_or("string"),
                c.get("jsonPath").and_then(Value::as_str).unwrap_or(""),
                c.get("priority").and_then(Value::as_i64).unwrap_or(0),
            ));
        }
        if !columns.iter().any(|c| c.name == "Age") {
            columns.push(col("Age", "date", ".metadata.creationTimestamp", 0));
        }
        out.push(ResourceInfo {
            group: group.to_string(),
            version: name.to_string(),
            plural: plural.to_string(),
            singular: singular.clone(),
            kind: kind.to_string(),
            namespaced,
            status_subresource: v.pointer("/subresources/status").is_some(),
            short_names: strs(names.get("shortNames")),
            categories: strs(names.get("categories")),
            columns,
            schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            builtin: false,
        });
    }
    Ok(out)
}
