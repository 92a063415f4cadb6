//! Reads what `plan` plans on: a `List` of Kubernetes objects (JSON or YAML, as `kubectl get
//! -o json|yaml` writes it) and a ScaleDownPolicy file, with errors that name the object.

use std::path::Path;

use ebb_api::ScaleDownPolicySpec;
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

use crate::cluster::ClusterObjects;

/// Input that `plan` cannot use.
#[derive(Debug, Error)]
pub enum InputError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is neither valid JSON nor YAML: {why}")]
    Syntax { path: String, why: String },
    #[error("{path}: expected a `List` (kubectl get … -o json) or a single object with `kind`")]
    NotAList { path: String },
    #[error("{path}: items[{index}] ({kind} {name}): {why}")]
    Object {
        path: String,
        index: usize,
        kind: String,
        name: String,
        why: String,
    },
    #[error("{path}: invalid ScaleDownPolicy: {why}")]
    Policy { path: String, why: String },
}

/// Parses JSON, or YAML when the text does not look like JSON.
pub fn parse_document(path: &str, text: &str) -> Result<Value, InputError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(text).map_err(|e| InputError::Syntax {
            path: path.into(),
            why: e.to_string(),
        })
    } else {
        serde_saphyr::from_str(text).map_err(|e| InputError::Syntax {
            path: path.into(),
            why: e.to_string(),
        })
    }
}

fn read(path: &Path) -> Result<(String, String), InputError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| InputError::Read {
        path: p.clone(),
        source: e,
    })?;
    Ok((p, text))
}

/// Objects of a snapshot file, plus warnings about what was skipped.
#[derive(Debug, Default)]
pub struct SnapshotFile {
    pub objects: ClusterObjects,
    pub warnings: Vec<String>,
}

/// Sorts the items of a `List` into [`ClusterObjects`]; unknown kinds become warnings.
pub fn objects_from_value(path: &str, doc: Value) -> Result<SnapshotFile, InputError> {
    let mut out = SnapshotFile::default();
    for (index, item) in list_items(path, doc)?.into_iter().enumerate() {
        let item = Item {
            path,
            index,
            kind: item
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            name: display_name(&item),
            value: item,
        };
        item.sort_into(&mut out)?;
    }
    Ok(out)
}

/// The objects of a document: a `List`'s items, one object, or a bare array.
fn list_items(path: &str, doc: Value) -> Result<Vec<Value>, InputError> {
    match doc {
        Value::Object(mut o) if o.contains_key("items") => match o.remove("items") {
            Some(Value::Array(items)) => Ok(items),
            Some(Value::Null) => Ok(Vec::new()),
            _ => Err(InputError::NotAList { path: path.into() }),
        },
        Value::Object(o) if o.contains_key("kind") => Ok(vec![Value::Object(o)]),
        Value::Array(items) => Ok(items),
        _ => Err(InputError::NotAList { path: path.into() }),
    }
}

/// `namespace/name` (or `name`) of an object, for messages.
fn display_name(item: &Value) -> String {
    let meta = item.get("metadata");
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str);
    let n = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)");
    match ns {
        Some(ns) => format!("{ns}/{n}"),
        None => n.to_string(),
    }
}

/// One item of a snapshot file, with where it came from for error messages.
struct Item<'a> {
    path: &'a str,
    index: usize,
    kind: String,
    name: String,
    value: Value,
}

impl Item<'_> {
    /// Deserializes the item as `T`, naming the field that does not fit.
    fn take<T: DeserializeOwned>(self) -> Result<T, InputError> {
        serde_path_to_error::deserialize(self.value).map_err(|e| InputError::Object {
            path: self.path.into(),
            index: self.index,
            kind: self.kind,
            name: self.name,
            why: format!("field `{}`: {}", e.path(), e.inner()),
        })
    }

    /// Adds the item to its kind's list, or a warning when plan does not use its kind.
    fn sort_into(self, out: &mut SnapshotFile) -> Result<(), InputError> {
        let o = &mut out.objects;
        match self.kind.as_str() {
            "Node" => o.nodes.push(self.take()?),
            "Pod" => o.pods.push(self.take()?),
            "PodDisruptionBudget" => o.pdbs.push(self.take()?),
            "ReplicaSet" => o.replica_sets.push(self.take()?),
            "StatefulSet" => o.stateful_sets.push(self.take()?),
            "DaemonSet" => o.daemon_sets.push(self.take()?),
            "Job" => o.jobs.push(self.take()?),
            "ReplicationController" => o.replication_controllers.push(self.take()?),
            "PersistentVolume" => o.persistent_volumes.push(self.take()?),
            "PersistentVolumeClaim" => o.persistent_volume_claims.push(self.take()?),
            "StorageClass" => o.storage_classes.push(self.take()?),
            "NodeState" => o.node_states.push(self.take()?),
            "MachineSet" | "MachineDeployment" | "NodeClaim" => {
                let kind = self.kind.clone();
                let d: kube::api::DynamicObject = self.take()?;
                match kind.as_str() {
                    "MachineSet" => o.providers.add_machine_set(&d),
                    "MachineDeployment" => o.providers.add_machine_deployment(&d),
                    _ => o.providers.add_node_claim(&d),
                }
            }
            "" => out.warnings.push(format!(
                "{}: items[{}] ({}) has no kind; skipped",
                self.path, self.index, self.name
            )),
            other => out.warnings.push(format!(
                "{}: items[{}] is a {other} ({}), which plan does not use; skipped",
                self.path, self.index, self.name
            )),
        }
        Ok(())
    }
}

/// Reads a snapshot file.
pub fn read_snapshot(path: &Path) -> Result<SnapshotFile, InputError> {
    let (p, text) = read(path)?;
    let doc = parse_document(&p, &text)?;
    objects_from_value(&p, doc)
}

/// Parses a policy: a whole `ScaleDownPolicy` object or just its `spec`.
pub fn parse_policy(path: &str, text: &str) -> Result<ScaleDownPolicySpec, InputError> {
    let doc = parse_document(path, text)?;
    let err = |why: String| InputError::Policy {
        path: path.into(),
        why,
    };
    let spec = match doc {
        Value::Object(mut o) if o.contains_key("kind") || o.contains_key("apiVersion") => {
            let kind = o.get("kind").and_then(Value::as_str).unwrap_or("");
            if kind != "ScaleDownPolicy" {
                return Err(err(format!("kind is `{kind}`, expected `ScaleDownPolicy`")));
            }
            o.remove("spec")
                .unwrap_or(Value::Object(Default::default()))
        }
        Value::Null => Value::Object(Default::default()),
        other => other,
    };
    serde_path_to_error::deserialize::<_, ScaleDownPolicySpec>(spec)
        .map_err(|e| err(format!("field `spec.{}`: {}", e.path(), e.inner())))
}

/// Reads a policy file.
pub fn read_policy(path: &Path) -> Result<ScaleDownPolicySpec, InputError> {
    let (p, text) = read(path)?;
    parse_policy(&p, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_in_json_and_yaml_with_unknown_kinds_skipped() {
        let json = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}},
            {"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"d"}},
            {"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"d"},"spec":{"containers":[]}}]}"#;
        let f = objects_from_value("s.json", parse_document("s.json", json).unwrap()).unwrap();
        assert_eq!((f.objects.nodes.len(), f.objects.pods.len()), (1, 1));
        assert_eq!(f.warnings.len(), 1);
        assert!(f.warnings[0].contains("Service (d/s)"), "{:?}", f.warnings);
        let yaml = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: n1\n";
        let f = objects_from_value("s.yaml", parse_document("s.yaml", yaml).unwrap()).unwrap();
        assert_eq!(f.objects.nodes.len(), 1);
    }

    #[test]
    fn a_malformed_object_is_named() {
        let json = r#"{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"p","namespace":"d"},"spec":{"containers":"nope"}}]}"#;
        let e = objects_from_value("s.json", parse_document("s.json", json).unwrap()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("items[0] (Pod d/p)") && msg.contains("spec.containers"),
            "{msg}"
        );
    }

    #[test]
    fn policies_whole_or_spec_and_errors_name_the_field() {
        let whole = "apiVersion: ebb.dev/v1alpha1\nkind: ScaleDownPolicy\nmetadata:\n  name: p\nspec:\n  utilizationThreshold: 0.7\n  maxDrainParallelism: 3\n";
        let spec = parse_policy("p.yaml", whole).unwrap();
        assert_eq!(spec.utilization_threshold, 0.7);
        assert_eq!(spec.max_drain_parallelism, 3);
        assert_eq!(
            spec.max_scale_down_parallelism, 10,
            "defaults fill the rest"
        );
        let bare = parse_policy("p.yaml", "unneededTime: 5m\n").unwrap();
        assert_eq!(bare.unneeded_time.as_duration().as_secs(), 300);
        let e = parse_policy("p.yaml", "unneededTime: soon\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.yaml") && e.contains("soon"), "{e}");
        let e = parse_policy("p.yaml", "maxDrainParallelism: many\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("p.yaml") && e.contains("spec.maxDrainParallelism"),
            "{e}"
        );
        let e = parse_policy("p.yaml", "kind: Deployment\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("Deployment"), "{e}");
    }
}
