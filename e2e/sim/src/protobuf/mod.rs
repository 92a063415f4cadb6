//! Decoding of Kubernetes protobuf request bodies for the few kinds clients send that way
//! (client-go's typed clients, e.g. Helm's release Secrets): Secret, ConfigMap, DeleteOptions.

use serde_json::{Map, Value, json};

/// The 4-byte prefix of Kubernetes protobuf bodies.
const MAGIC: &[u8] = b"k8s\0";

/// A body that is not a protobuf the simulator can read.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("cannot decode the protobuf body: {0}")]
pub struct ProtoError(pub String);

fn err(s: &str) -> ProtoError {
    ProtoError(s.to_string())
}

/// One field: number and either a varint or a length-delimited payload.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| err("truncated varint"))?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(err("varint too long"))
    }

    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, ProtoError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        let f = match wire {
            0 => Field::Varint(self.varint()?),
            2 => {
                let len = self.varint()? as usize;
                let end = self
                    .pos
                    .checked_add(len)
                    .filter(|e| *e <= self.buf.len())
                    .ok_or_else(|| err("truncated field"))?;
                let b = &self.buf[self.pos..end];
                self.pos = end;
                Field::Bytes(b)
            }
            1 => {
                self.pos += 8;
                Field::Varint(0)
            }
            5 => {
                self.pos += 4;
                Field::Varint(0)
            }
            _ => return Err(err("unsupported wire type")),
        };
        Ok(Some((num, f)))
    }
}

fn string(b: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec()).map_err(|_| err("invalid UTF-8 string"))
}

/// A `map<string, X>` entry: (key, value bytes).
fn map_entry(b: &[u8]) -> Result<(String, &[u8]), ProtoError> {
    let mut r = Reader::new(b);
    let (mut k, mut v): (String, &[u8]) = (String::new(), &[]);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(x)) => k = string(x)?,
            (2, Field::Bytes(x)) => v = x,
            _ => {}
        }
    }
    Ok((k, v))
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

fn object_meta(b: &[u8]) -> Result<Value, ProtoError> {
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    let mut owners = Vec::new();
    let mut r = Reader::new(b);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(x)) => {
                m.insert("name".into(), json!(string(x)?));
            }
            (2, Field::Bytes(x)) => {
                m.insert("generateName".into(), json!(string(x)?));
            }
            (3, Field::Bytes(x)) => {
                m.insert("namespace".into(), json!(string(x)?));
            }
            (5, Field::Bytes(x)) => {
                m.insert("uid".into(), json!(string(x)?));
            }
            (6, Field::Bytes(x)) => {
                m.insert("resourceVersion".into(), json!(string(x)?));
            }
            (11, Field::Bytes(x)) => {
                let (k, v) = map_entry(x)?;
                labels.insert(k, json!(string(v)?));
            }
            (12, Field::Bytes(x)) => {
                let (k, v) = map_entry(x)?;
                annotations.insert(k, json!(string(v)?));
            }
            (13, Field::Bytes(x)) => {
                let mut o = Map::new();
                let mut rr = Reader::new(x);
                while let Some((n, f)) = rr.next()? {
                    match (n, f) {
                        (1, Field::Bytes(y)) => {
                            o.insert("kind".into(), json!(string(y)?));
                        }
                        (3, Field::Bytes(y)) => {
                            o.insert("name".into(), json!(string(y)?));
                        }
                        (4, Field::Bytes(y)) => {
                            o.insert("uid".into(), json!(string(y)?));
                        }
                        (5, Field::Bytes(y)) => {
                            o.insert("apiVersion".into(), json!(string(y)?));
                        }
                        (6, Field::Varint(v)) => {
                            o.insert("controller".into(), json!(v != 0));
                        }
                        (7, Field::Varint(v)) => {
                            o.insert("blockOwnerDeletion".into(), json!(v != 0));
                        }
                        _ => {}
                    }
                }
                owners.push(Value::Object(o));
            }
            (14, Field::Bytes(x)) => finalizers.push(json!(string(x)?)),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    if !owners.is_empty() {
        m.insert("ownerReferences".into(), Value::Array(owners));
    }
    Ok(Value::Object(m))
}

/// Decodes a protobuf body (`k8s\0` envelope) of a Secret or ConfigMap into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| err("missing the k8s protobuf prefix"))?;
    let (mut api_version, mut kind, mut raw): (String, String, &[u8]) =
        (String::new(), String::new(), &[]);
    let mut r = Reader::new(rest);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                let mut t = Reader::new(tm);
                while let Some((n, f)) = t.next()? {
                    match (n, f) {
                        (1, Field::Bytes(x)) => api_version = string(x)?,
                        (2, Field::Bytes(x)) => kind = string(x)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    let mut obj = json!({"apiVersion": api_version, "kind": kind});
    let mut data = Map::new();
    let mut second = Map::new();
    let mut r = Reader::new(raw);
    match kind.as_str() {
        "Secret" | "ConfigMap" => {
            while let Some((n, f)) = r.next()? {
                match (kind.as_str(), n, f) {
                    (_, 1, Field::Bytes(x)) => obj["metadata"] = object_meta(x)?,
                    ("Secret", 2, Field::Bytes(x)) => {
                        let (k, v) = map_entry(x)?;
                        data.insert(k, json!(base64(v)));
                    }
                    ("Secret", 3, Field::Bytes(x)) => obj["type"] = json!(string(x)?),
                    ("Secret", 4, Field::Bytes(x)) => {
                        let (k, v) = map_entry(x)?;
                        second.insert(k, json!(string(v)?));
                    }
                    ("ConfigMap", 2, Field::Bytes(x)) => {
                        let (k, v) = map_entry(x)?;
                        data.insert(k, json!(string(v)?));
                    }
                    ("ConfigMap", 3, Field::Bytes(x)) => {
                        let (k, v) = map_entry(x)?;
                        second.insert(k, json!(base64(v)));
                    }
                    (_, 5, Field::Varint(v)) if kind == "Secret" => {
                        obj["immutable"] = json!(v != 0)
                    }
                    (_, 4, Field::Varint(v)) if kind == "ConfigMap" => {
                        obj["immutable"] = json!(v != 0)
                    }
                    _ => {}
                }
            }
        }
        // client-go sends the options of a delete this way (Helm's uninstall purging its
        // release Secret).
        "DeleteOptions" => {
            let mut dry_run = vec![];
            while let Some((n, f)) = r.next()? {
                match (n, f) {
                    (1, Field::Varint(v)) => obj["gracePeriodSeconds"] = json!(v as i64),
                    (2, Field::Bytes(x)) => {
                        let mut p = Reader::new(x);
                        let mut pre = Map::new();
                        while let Some((n, f)) = p.next()? {
                            match (n, f) {
                                (1, Field::Bytes(v)) => pre.insert("uid".into(), json!(string(v)?)),
                                (2, Field::Bytes(v)) => {
                                    pre.insert("resourceVersion".into(), json!(string(v)?))
                                }
                                _ => None,
                            };
                        }
                        obj["preconditions"] = Value::Object(pre);
                    }
                    (3, Field::Varint(v)) => obj["orphanDependents"] = json!(v != 0),
                    (4, Field::Bytes(x)) => obj["propagationPolicy"] = json!(string(x)?),
                    (5, Field::Bytes(x)) => dry_run.push(json!(string(x)?)),
                    _ => {}
                }
            }
            if !dry_run.is_empty() {
                obj["dryRun"] = Value::Array(dry_run);
            }
        }
        other => {
            return Err(ProtoError(format!(
                "protobuf bodies of kind {other:?} are not supported; send JSON"
            )));
        }
    }
    if !data.is_empty() {
        obj["data"] = Value::Object(data);
    }
    if !second.is_empty() {
        obj[if kind == "Secret" {
            "stringData"
        } else {
            "binaryData"
        }] = Value::Object(second);
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((n << 3) | 2) as u8, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_a_secret() {
        let meta = [
            field(1, b"rel"),
            field(11, &[field(1, b"owner"), field(2, b"helm")].concat()),
        ]
        .concat();
        let secret = [
            field(1, &meta),
            field(2, &[field(1, b"release"), field(2, b"abc")].concat()),
            field(3, b"helm.sh/release.v1"),
        ]
        .concat();
        let tm = [field(1, b"v1"), field(2, b"Secret")].concat();
        let body = [MAGIC.to_vec(), field(1, &tm), field(2, &secret)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rel", "labels": {"owner": "helm"}},
            "data": {"release": "YWJj"}, "type": "helm.sh/release.v1"})
        );
        assert!(decode(b"{}").is_err());
    }

    #[test]
    fn decodes_delete_options() {
        let tm = [field(1, b"v1"), field(2, b"DeleteOptions")].concat();
        let opts = [
            vec![1 << 3, 30],
            field(2, &field(1, b"u-1")),
            field(4, b"Foreground"),
            field(5, b"All"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &tm), field(2, &opts)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 30,
                   "preconditions": {"uid": "u-1"}, "propagationPolicy": "Foreground", "dryRun": ["All"]})
        );
        let empty = [MAGIC.to_vec(), field(1, &tm)].concat();
        assert_eq!(
            decode(&empty).unwrap(),
            json!({"apiVersion": "v1", "kind": "DeleteOptions"})
        );
    }

    #[test]
    fn base64_padding() {
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
    }
}
