//! PersistentVolumes, claims and StorageClasses for tests: local and zonal volumes, bound and
//! unbound claims, static and provisioned classes.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("test object: {e}"))
}

/// A volume of `class` usable where the node label `key` is `value` (Available unless `claim`
/// names the claim it is bound to).
pub fn volume_on(
    name: &str,
    class: &str,
    key: &str,
    value: &str,
    claim: Option<&str>,
) -> PersistentVolume {
    let mut pv = json!({
        "metadata": {"name": name},
        "spec": {
            "storageClassName": class,
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/mnt/disk"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}}
        },
        "status": {"phase": if claim.is_some() { "Bound" } else { "Available" }}
    });
    if let Some(c) = claim {
        pv["spec"]["claimRef"] = json!({"namespace": "default", "name": c});
    }
    from(pv)
}

/// A local volume on node `node` (hostname affinity), bound to `claim` when given.
pub fn local_volume(name: &str, node: &str, claim: Option<&str>) -> PersistentVolume {
    volume_on(name, "local", "kubernetes.io/hostname", node, claim)
}

/// A claim in `default` bound to volume `pv`.
pub fn bound_claim(name: &str, pv: &str) -> PersistentVolumeClaim {
    from(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"volumeName": pv, "storageClassName": "local", "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Bound"}
    }))
}

/// A claim in `default` of `class` not bound yet.
pub fn unbound_claim(name: &str, class: &str) -> PersistentVolumeClaim {
    from(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"}
    }))
}

/// A StorageClass; `wait_for_consumer` picks `WaitForFirstConsumer` binding, `zones` its
/// allowed topologies (`topology.kubernetes.io/zone`).
pub fn storage_class(
    name: &str,
    provisioner: &str,
    wait_for_consumer: bool,
    zones: &[&str],
) -> StorageClass {
    let mut sc = json!({
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": if wait_for_consumer { "WaitForFirstConsumer" } else { "Immediate" },
    });
    if !zones.is_empty() {
        sc["allowedTopologies"] = json!([{"matchLabelExpressions": [
            {"key": "topology.kubernetes.io/zone", "values": zones}]}]);
    }
    from(sc)
}
