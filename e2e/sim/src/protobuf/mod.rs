//! Kubernetes protobuf request bodies (the `k8s\0` envelope that kubectl and client-go's typed
//! clients send) decoded with the k8s-pb message types into the JSON objects the simulator stores.

mod types;

use std::collections::BTreeMap;

use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{RawExtension, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Map, Value, json};

/// The 4-byte prefix of Kubernetes protobuf bodies.
const MAGIC: &[u8] = b"k8s\0";

/// A body that is not a protobuf the simulator can read.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("cannot decode the protobuf body: {0}")]
pub struct ProtoError(pub String);

type R<T> = Result<T, ProtoError>;

/// A k8s-pb message turned into its Kubernetes JSON form.
trait Conv {
    fn conv(self) -> R<Value>;
}

fn decode_as<T: Message + Default + Conv>(raw: &[u8]) -> R<Value> {
    T::decode(raw)
        .map_err(|e| ProtoError(e.to_string()))?
        .conv()
}

/// Decodes a protobuf body (`k8s\0` envelope around a `runtime.Unknown`) of any kind of the
/// groups the simulator serves, plus `DeleteOptions`, into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ProtoError("missing the k8s protobuf prefix".into()))?;
    let u = Unknown::decode(rest).map_err(|e| ProtoError(e.to_string()))?;
    let tm = u.type_meta.unwrap_or_default();
    let api_version = tm.api_version.unwrap_or_default();
    let kind = tm.kind.unwrap_or_default();
    let raw = u.raw.unwrap_or_default();
    let decoded = match kind.as_str() {
        // client-go sends the options of a delete in the group of the resource deleted.
        "DeleteOptions" => decode_as::<meta::DeleteOptions>(&raw),
        _ => types::decode_kind(&api_version, &kind, &raw).unwrap_or_else(|| {
            Err(ProtoError(format!(
                "protobuf bodies of kind {kind:?} ({api_version}) are not supported; send JSON"
            )))
        }),
    }?;
    let mut obj = json!({"apiVersion": api_version, "kind": kind});
    if let (Some(o), Value::Object(fields)) = (obj.as_object_mut(), decoded) {
        o.extend(fields);
    }
    Ok(obj)
}

// ---- field helpers used by the generated conversions (types.rs) ----

fn put(m: &mut Map<String, Value>, k: &str, v: Value) {
    if !v.is_null() {
        m.insert(k.to_string(), v);
    }
}

/// A string; an empty one is left out (Go encodes its unset strings as empty ones).
fn s(m: &mut Map<String, Value>, k: &str, v: Option<String>) -> R<()> {
    if let Some(v) = v.filter(|v| !v.is_empty()) {
        put(m, k, Value::String(v));
    }
    Ok(())
}

fn ss(m: &mut Map<String, Value>, k: &str, v: Vec<String>) -> R<()> {
    if !v.is_empty() {
        put(m, k, json!(v));
    }
    Ok(())
}

fn n<T: Into<Value>>(m: &mut Map<String, Value>, k: &str, v: Option<T>) -> R<()> {
    if let Some(v) = v {
        put(m, k, v.into());
    }
    Ok(())
}

fn ns<T: Into<Value>>(m: &mut Map<String, Value>, k: &str, v: Vec<T>) -> R<()> {
    if !v.is_empty() {
        put(m, k, Value::Array(v.into_iter().map(Into::into).collect()));
    }
    Ok(())
}

fn b(m: &mut Map<String, Value>, k: &str, v: Option<bool>) -> R<()> {
    n(m, k, v)
}

fn by(m: &mut Map<String, Value>, k: &str, v: Option<Vec<u8>>) -> R<()> {
    if let Some(v) = v {
        put(m, k, Value::String(base64(&v)));
    }
    Ok(())
}

fn msg<T: Conv>(m: &mut Map<String, Value>, k: &str, v: Option<T>) -> R<()> {
    if let Some(v) = v {
        put(m, k, v.conv()?);
    }
    Ok(())
}

fn msgs<T: Conv>(m: &mut Map<String, Value>, k: &str, v: Vec<T>) -> R<()> {
    if !v.is_empty() {
        let a = v.into_iter().map(Conv::conv).collect::<R<Vec<_>>>()?;
        put(m, k, Value::Array(a));
    }
    Ok(())
}

fn smap(m: &mut Map<String, Value>, k: &str, v: BTreeMap<String, String>) -> R<()> {
    if !v.is_empty() {
        put(m, k, json!(v));
    }
    Ok(())
}

fn bmap(m: &mut Map<String, Value>, k: &str, v: BTreeMap<String, Vec<u8>>) -> R<()> {
    if !v.is_empty() {
        let o: Map<String, Value> = v
            .into_iter()
            .map(|(k, v)| (k, Value::String(base64(&v))))
            .collect();
        put(m, k, Value::Object(o));
    }
    Ok(())
}

fn mmap<T: Conv>(m: &mut Map<String, Value>, k: &str, v: BTreeMap<String, T>) -> R<()> {
    if !v.is_empty() {
        let mut o = Map::new();
        for (key, x) in v {
            o.insert(key, x.conv()?);
        }
        put(m, k, Value::Object(o));
    }
    Ok(())
}

/// An embedded Go struct: its fields go into the enclosing object.
fn inline<T: Conv>(m: &mut Map<String, Value>, v: Option<T>) -> R<()> {
    if let Some(Value::Object(o)) = v.map(Conv::conv).transpose()? {
        m.extend(o);
    }
    Ok(())
}

// ---- the messages whose JSON form is not an object of their fields ----

/// RFC 3339 in UTC with `digits` fractional digits; `None` for Go's zero time.
fn timestamp(seconds: Option<i64>, nanos: Option<i32>, digits: usize) -> R<Value> {
    let (sec, ns) = (seconds.unwrap_or(0), nanos.unwrap_or(0));
    if sec == 0 && ns == 0 {
        return Ok(Value::Null);
    }
    let t = jiff::Timestamp::new(sec, ns).map_err(|e| ProtoError(format!("bad time: {e}")))?;
    let s = if digits == 0 {
        t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
    };
    Ok(Value::String(s))
}

impl Conv for meta::Time {
    fn conv(self) -> R<Value> {
        timestamp(self.seconds, self.nanos, 0)
    }
}

impl Conv for meta::MicroTime {
    fn conv(self) -> R<Value> {
        timestamp(self.seconds, self.nanos, 6)
    }
}

impl Conv for meta::Duration {
    /// Go's `time.Duration` text (`1h2m3.5s`, `300ms`).
    fn conv(self) -> R<Value> {
        let d = self.duration.unwrap_or(0);
        let abs = d.unsigned_abs();
        let sign = if d < 0 { "-" } else { "" };
        let s = if abs == 0 {
            "0s".to_string()
        } else if abs < 1_000_000_000 {
            format!("{sign}{}ms", abs as f64 / 1e6)
        } else {
            let (h, rest) = (abs / 3_600_000_000_000, abs % 3_600_000_000_000);
            let (mi, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
            let secs = rest as f64 / 1e9;
            let mut out = sign.to_string();
            if h > 0 {
                out += &format!("{h}h");
            }
            if h > 0 || mi > 0 {
                out += &format!("{mi}m");
            }
            out + &format!("{secs}s")
        };
        Ok(Value::String(s))
    }
}

/// Raw JSON carried in a protobuf `bytes` field.
fn raw_json(raw: Option<Vec<u8>>) -> R<Value> {
    match raw {
        None => Ok(Value::Null),
        Some(r) if r.is_empty() => Ok(Value::Null),
        Some(r) => serde_json::from_slice(&r)
            .map_err(|e| ProtoError(format!("an embedded object is not JSON: {e}"))),
    }
}

impl Conv for meta::FieldsV1 {
    fn conv(self) -> R<Value> {
        raw_json(self.raw)
    }
}

impl Conv for RawExtension {
    fn conv(self) -> R<Value> {
        raw_json(self.raw)
    }
}

impl Conv for IntOrString {
    fn conv(self) -> R<Value> {
        Ok(match self.r#type {
            Some(1) => Value::String(self.str_val.unwrap_or_default()),
            _ => json!(self.int_val.unwrap_or(0)),
        })
    }
}

impl Conv for Quantity {
    fn conv(self) -> R<Value> {
        Ok(Value::String(self.string.unwrap_or_default()))
    }
}

const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64, as JSON carries `[]byte`.
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::api::apps::v1 as apps;
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::api::policy::v1 as policy;

    /// The envelope as client-go writes it.
    fn envelope<T: Message>(api_version: &str, kind: &str, m: &T) -> Vec<u8> {
        let u = Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(m.encode_to_vec()),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC.to_vec(), u.encode_to_vec()].concat()
    }

    fn meta(name: &str) -> Option<meta::ObjectMeta> {
        Some(meta::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(String::new()),
            creation_timestamp: Some(meta::Time::default()),
            labels: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        })
    }

    #[test]
    fn decodes_a_secret_with_bytes_and_type() {
        let s = core::Secret {
            metadata: meta("rel"),
            data: [("release".to_string(), b"abc".to_vec())].into(),
            r#type: Some("helm.sh/release.v1".into()),
            immutable: None,
            string_data: Default::default(),
        };
        assert_eq!(
            decode(&envelope("v1", "Secret", &s)).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rel", "labels": {"app": "web"}},
                "data": {"release": "YWJj"}, "type": "helm.sh/release.v1"})
        );
        assert!(decode(b"{}").is_err());
    }

    #[test]
    fn decodes_a_deployment_as_kubectl_create_sends_it() {
        let container = core::Container {
            name: Some("web".into()),
            image: Some("nginx".into()),
            resources: Some(core::ResourceRequirements {
                requests: [(
                    "cpu".to_string(),
                    Quantity {
                        string: Some("100m".into()),
                    },
                )]
                .into(),
                ..Default::default()
            }),
            ports: vec![core::ContainerPort {
                container_port: Some(80),
                protocol: Some("TCP".into()),
                ..Default::default()
            }],
            stdin: Some(false),
            ..Default::default()
        };
        let d = apps::Deployment {
            metadata: meta("web"),
            spec: Some(apps::DeploymentSpec {
                replicas: Some(0),
                selector: Some(meta::LabelSelector {
                    match_labels: [("app".to_string(), "web".to_string())].into(),
                    ..Default::default()
                }),
                template: Some(core::PodTemplateSpec {
                    metadata: meta("ignored"),
                    spec: Some(core::PodSpec {
                        containers: vec![container],
                        ..Default::default()
                    }),
                }),
                strategy: Some(apps::DeploymentStrategy {
                    r#type: Some("RollingUpdate".into()),
                    rolling_update: Some(apps::RollingUpdateDeployment {
                        max_surge: Some(IntOrString {
                            r#type: Some(1),
                            int_val: Some(0),
                            str_val: Some("25%".into()),
                        }),
                        max_unavailable: Some(IntOrString {
                            r#type: Some(0),
                            int_val: Some(1),
                            str_val: Some(String::new()),
                        }),
                    }),
                }),
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        let v = decode(&envelope("apps/v1", "Deployment", &d)).unwrap();
        assert_eq!(v["kind"], "Deployment");
        assert_eq!(v["apiVersion"], "apps/v1");
        assert_eq!(
            v["metadata"],
            json!({"name": "web", "labels": {"app": "web"}})
        );
        // replicas 0 stays (a pointer field set to zero), unlike an empty string.
        assert_eq!(v["spec"]["replicas"], 0);
        assert_eq!(
            v["spec"]["selector"],
            json!({"matchLabels": {"app": "web"}})
        );
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0],
            json!({"name": "web", "image": "nginx", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m"}}, "stdin": false})
        );
        assert_eq!(
            v["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}})
        );
        assert_eq!(v["status"], json!({}));
    }

    #[test]
    fn decodes_an_eviction_and_delete_options() {
        let e = policy::Eviction {
            metadata: meta("web-1"),
            delete_options: Some(meta::DeleteOptions {
                grace_period_seconds: Some(30),
                preconditions: Some(meta::Preconditions {
                    uid: Some("u-1".into()),
                    resource_version: None,
                }),
                propagation_policy: Some("Foreground".into()),
                dry_run: vec!["All".into()],
                ..Default::default()
            }),
        };
        assert_eq!(
            decode(&envelope("policy/v1", "Eviction", &e)).unwrap(),
            json!({"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "web-1", "labels": {"app": "web"}},
                "deleteOptions": {"gracePeriodSeconds": 30, "preconditions": {"uid": "u-1"},
                    "propagationPolicy": "Foreground", "dryRun": ["All"]}})
        );
        let empty = envelope("v1", "DeleteOptions", &meta::DeleteOptions::default());
        assert_eq!(
            decode(&empty).unwrap(),
            json!({"apiVersion": "v1", "kind": "DeleteOptions"})
        );
    }

    #[test]
    fn embedded_structs_are_inlined_and_times_are_rfc3339() {
        let p = core::Pod {
            metadata: Some(meta::ObjectMeta {
                name: Some("p".into()),
                creation_timestamp: Some(meta::Time {
                    seconds: Some(1_700_000_000),
                    nanos: Some(0),
                }),
                ..Default::default()
            }),
            spec: Some(core::PodSpec {
                volumes: vec![core::Volume {
                    name: Some("cfg".into()),
                    volume_source: Some(core::VolumeSource {
                        config_map: Some(core::ConfigMapVolumeSource {
                            local_object_reference: Some(core::LocalObjectReference {
                                name: Some("cfg".into()),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }],
                ..Default::default()
            }),
            status: None,
        };
        let v = decode(&envelope("v1", "Pod", &p)).unwrap();
        assert_eq!(
            v["metadata"]["creationTimestamp"],
            json!("2023-11-14T22:13:20Z")
        );
        assert_eq!(
            v["spec"]["volumes"],
            json!([{"name": "cfg", "configMap": {"name": "cfg"}}])
        );
    }

    #[test]
    fn unknown_kinds_and_garbage_are_refused() {
        let e = decode(&envelope(
            "example.com/v1",
            "Widget",
            &meta::Status::default(),
        ))
        .unwrap_err();
        assert!(e.0.contains("Widget"), "{e}");
        assert!(decode(&[MAGIC, &[0xff, 0xff, 0xff]].concat()).is_err());
    }

    #[test]
    fn hostile_bodies_are_refused_not_trusted() {
        // A length prefix far past the end of the body.
        let huge = [MAGIC, &[0x12, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3][..]].concat();
        assert!(decode(&huge).is_err());
        // A ConfigMap whose metadata.name (field 1 of field 1) is not UTF-8.
        let cm = vec![0x0a, 4, 0x0a, 2, 0xff, 0xfe];
        assert!(decode(&envelope_raw("v1", "ConfigMap", cm)).is_err());
        // A time out of range, and an embedded object that is not JSON.
        let p = core::Pod {
            metadata: Some(meta::ObjectMeta {
                creation_timestamp: Some(meta::Time {
                    seconds: Some(i64::MAX),
                    nanos: Some(0),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(decode(&envelope("v1", "Pod", &p)).is_err());
        let cr = k8s_pb::api::apps::v1::ControllerRevision {
            data: Some(RawExtension {
                raw: Some(b"{not json".to_vec()),
            }),
            ..Default::default()
        };
        assert!(decode(&envelope("apps/v1", "ControllerRevision", &cr)).is_err());
    }

    fn envelope_raw(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let u = Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: None,
            content_type: None,
        };
        [MAGIC.to_vec(), u.encode_to_vec()].concat()
    }

    #[test]
    fn durations_print_as_go_does() {
        let d = |n: i64| meta::Duration { duration: Some(n) }.conv().unwrap();
        assert_eq!(d(0), "0s");
        assert_eq!(d(300_000_000), "300ms");
        assert_eq!(d(90_000_000_000), "1m30s");
        assert_eq!(d(3_600_000_000_000), "1h0m0s");
    }

    #[test]
    fn base64_padding() {
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
    }
}
