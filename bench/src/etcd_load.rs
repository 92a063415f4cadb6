//! Writes objects straight into a test control plane's etcd (its v3 JSON gateway), as the API
//! server stores them: the scale bench's bulk set-up, hundreds of pods a transaction.
//!
//! kube-apiserver decodes JSON from etcd as well as protobuf and applies defaults when it reads,
//! so an object written here is served, watched and cached like one it wrote itself (its
//! `resourceVersion` is etcd's revision). Nothing is validated or admitted: the caller writes
//! whole, valid objects with a `uid` and `creationTimestamp`. Only for clusters a bench owns.

use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// One object to write: its etcd key (`/registry/<resource>/<namespace>/<name>`) and body.
pub struct Put {
    pub key: String,
    pub object: Value,
}

/// `metadata.<field>` of `object`, which an object written to etcd must have.
fn meta(object: &Value, field: &str) -> anyhow::Result<String> {
    object
        .pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("an object written to etcd needs metadata.{field}"))
}

impl Put {
    /// The key kube-apiserver stores a namespaced object of `resource` under (the core group's
    /// and `apps`' resources: no group in the key).
    pub fn namespaced(resource: &str, object: Value) -> anyhow::Result<Self> {
        let ns = meta(&object, "namespace")?;
        Self::at(format!("/registry/{resource}/{ns}"), object)
    }

    /// The key of a cluster-scoped object: `key_resource` as kube-apiserver names it in etcd
    /// (Nodes are `minions`).
    pub fn cluster(key_resource: &str, object: Value) -> anyhow::Result<Self> {
        Self::at(format!("/registry/{key_resource}"), object)
    }

    /// `object` under `<prefix>/<name>`, once it has what kube-apiserver would have set.
    fn at(prefix: String, object: Value) -> anyhow::Result<Self> {
        let name = meta(&object, "name")?;
        meta(&object, "uid")?;
        meta(&object, "creationTimestamp")?;
        Ok(Put {
            key: format!("{prefix}/{name}"),
            object,
        })
    }
}

/// A client of one etcd's gateway (`http://127.0.0.1:<port>`).
pub struct EtcdLoader {
    http: reqwest::Client,
    url: String,
}

impl EtcdLoader {
    pub fn new(port: u16) -> anyhow::Result<Self> {
        // reqwest is built without a TLS provider of its own; etcd's gateway is plain HTTP, but
        // a client is only built with one in place (already installed by kube is fine).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .context("an HTTP client for etcd's gateway")?;
        Ok(EtcdLoader {
            http,
            url: format!("http://127.0.0.1:{port}/v3/kv/txn"),
        })
    }

    /// Writes `puts` in one transaction: all of them at one revision, so a watcher sees an owner
    /// and its pods together. etcd's `--max-txn-ops` and `--max-request-bytes` bound its size.
    pub async fn put_all(&self, puts: &[Put]) -> anyhow::Result<()> {
        let ops: Vec<Value> = puts
            .iter()
            .map(|p| {
                let value = serde_json::to_vec(&p.object)?;
                Ok(json!({"requestPut": {
                    "key": STANDARD.encode(p.key.as_bytes()),
                    "value": STANDARD.encode(value),
                }}))
            })
            .collect::<anyhow::Result<_>>()?;
        let body = serde_json::to_vec(&json!({"success": ops}))?;
        let resp = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .with_context(|| format!("writing {} objects to etcd at {}", puts.len(), self.url))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!(
                "etcd refused a transaction of {} objects ({status}): {text}",
                puts.len()
            );
        }
        let answer: Value = serde_json::from_str(&text)
            .with_context(|| format!("etcd's answer to a transaction is not JSON: {text}"))?;
        if answer.get("succeeded").and_then(Value::as_bool) != Some(true) {
            bail!("etcd did not apply a transaction: {text}");
        }
        Ok(())
    }
}

/// A UID for the `i`-th object of `kind` (1–15): unique within a bench's cluster.
pub fn uid(kind: u8, i: usize) -> String {
    format!("eb0{kind:x}0000-0000-4000-8000-{i:012x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_where_the_api_server_looks() {
        let p = Put::namespaced(
            "pods",
            json!({"metadata": {"name": "a", "namespace": "ns", "uid": uid(1, 7),
                "creationTimestamp": "2026-11-29T00:00:00Z"}}),
        )
        .unwrap();
        assert_eq!(p.key, "/registry/pods/ns/a");
        let n = Put::cluster(
            "minions",
            json!({"metadata": {"name": "n", "uid": uid(3, 1),
                "creationTimestamp": "2026-11-29T00:00:00Z"}}),
        )
        .unwrap();
        assert_eq!(n.key, "/registry/minions/n");
        assert!(Put::cluster("minions", json!({"metadata": {"name": "n"}})).is_err());
        let e = Put::namespaced(
            "pods",
            json!({"metadata": {"name": "a", "namespace": "ns"}}),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("metadata.uid"), "{e}");
        assert_ne!(uid(1, 7), uid(2, 7));
        assert_ne!(uid(1, 7), uid(1, 8));
        assert_eq!(uid(1, 7).len(), 36);
    }
}
