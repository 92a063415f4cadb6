//! The OpenAPI documents ebb-sim serves (`/openapi/v2` as protobuf, `/openapi/v3` per group
//! version as JSON), built from k8s-openapi's schemas of the built-in kinds and the CRDs' schemas.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::{apps, batch, coordination, core, events, policy, rbac};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::registry::ResourceInfo;

/// Where OpenAPI v3 documents keep their schemas; v2 ones use `#/definitions/`.
const V3_REFS: &str = "#/components/schemas/";
const V2_REFS: &str = "#/definitions/";

/// The schemas of the built-in kinds (and everything they refer to), keyed by their OpenAPI
/// names (`io.k8s.api.apps.v1.Deployment`), refs in the v3 form, kinds marked with
/// `x-kubernetes-group-version-kind` as a real server marks them.
pub struct Builtins {
    pub definitions: Map<String, Value>,
    /// (group, version, kind) → definition name.
    pub kinds: BTreeMap<(String, String, String), String>,
}

fn add<T: k8s_openapi::Resource + schemars::JsonSchema>(
    g: &mut SchemaGenerator,
    kinds: &mut BTreeMap<(String, String, String), String>,
) {
    g.subschema_for::<T>();
    kinds.insert(
        (T::GROUP.into(), T::VERSION.into(), T::KIND.into()),
        T::schema_name().into_owned(),
    );
}

/// The built-in kinds' schemas, computed once.
pub fn builtins() -> &'static Builtins {
    static B: OnceLock<Builtins> = OnceLock::new();
    B.get_or_init(|| {
        let mut g = SchemaSettings::openapi3().into_generator();
        let mut kinds = BTreeMap::new();
        let k = &mut kinds;
        add::<core::v1::Namespace>(&mut g, k);
        add::<core::v1::Node>(&mut g, k);
        add::<core::v1::Pod>(&mut g, k);
        add::<core::v1::Event>(&mut g, k);
        add::<core::v1::Secret>(&mut g, k);
        add::<core::v1::ConfigMap>(&mut g, k);
        add::<core::v1::ServiceAccount>(&mut g, k);
        add::<core::v1::Service>(&mut g, k);
        add::<core::v1::Binding>(&mut g, k);
        add::<events::v1::Event>(&mut g, k);
        add::<policy::v1::PodDisruptionBudget>(&mut g, k);
        add::<policy::v1::Eviction>(&mut g, k);
        add::<apps::v1::ReplicaSet>(&mut g, k);
        add::<apps::v1::Deployment>(&mut g, k);
        add::<apps::v1::StatefulSet>(&mut g, k);
        add::<apps::v1::DaemonSet>(&mut g, k);
        add::<batch::v1::Job>(&mut g, k);
        add::<coordination::v1::Lease>(&mut g, k);
        add::<rbac::v1::Role>(&mut g, k);
        add::<rbac::v1::RoleBinding>(&mut g, k);
        add::<rbac::v1::ClusterRole>(&mut g, k);
        add::<rbac::v1::ClusterRoleBinding>(&mut g, k);
        add::<apiext::CustomResourceDefinition>(&mut g, k);
        add::<k8s_openapi::api::autoscaling::v1::Scale>(&mut g, k);
        g.subschema_for::<meta::DeleteOptions>();
        g.subschema_for::<meta::Status>();
        let mut definitions = g.take_definitions(true);
        for ((group, version, kind), name) in &kinds {
            if let Some(Value::Object(d)) = definitions.get_mut(name) {
                d.insert(
                    "x-kubernetes-group-version-kind".into(),
                    json!([{"group": group, "version": version, "kind": kind}]),
                );
            }
        }
        Builtins { definitions, kinds }
    })
}

/// The schema of a kind the simulator serves, refs resolved against [`Builtins::definitions`]:
/// the built-in schema, or the CRD's `openAPIV3Schema` (with `metadata` as ObjectMeta).
pub fn schema_of(ri: &ResourceInfo) -> Option<Value> {
    if let Some(s) = &ri.schema {
        return Some(crd_schema(ri, s));
    }
    let b = builtins();
    let name = b
        .kinds
        .get(&(ri.group.clone(), ri.version.clone(), ri.kind.clone()))?;
    b.definitions.get(name).cloned()
}

fn object_meta_ref() -> Value {
    json!({"$ref": format!("{V3_REFS}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")})
}

fn crd_schema(ri: &ResourceInfo, s: &Value) -> Value {
    let mut s = s.clone();
    if let Some(o) = s.as_object_mut() {
        let props = o
            .entry("properties")
            .or_insert_with(|| json!({}))
            .as_object_mut();
        if let Some(p) = props {
            p.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
            p.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
            p.insert("metadata".into(), object_meta_ref());
        }
        o.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": ri.group, "version": ri.version, "kind": ri.kind}]),
        );
    }
    s
}

/// The fields of `obj` its kind's schema does not declare, as a real server names them in
/// `strict decoding error: unknown field "spec.foo"` (`a.b[0].c`). Keys starting with `$` are
/// strategic-merge-patch directives, not fields. Under `x-kubernetes-preserve-unknown-fields`,
/// a free-form object or an `additionalProperties` map, any field is known.
pub fn unknown_fields(schema: &Value, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    unknown_at(schema, obj, "", &mut out, 0);
    out
}

fn resolve(s: &Value) -> &Value {
    let defs = &builtins().definitions;
    let mut s = s;
    for _ in 0..8 {
        if let Some(r) = s.get("$ref").and_then(Value::as_str)
            && let Some(d) = r.strip_prefix(V3_REFS).and_then(|n| defs.get(n))
        {
            s = d;
        } else if let Some([one]) = s.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
            s = one;
        } else {
            break;
        }
    }
    s
}

fn unknown_at(schema: &Value, v: &Value, path: &str, out: &mut Vec<String>, depth: usize) {
    let s = resolve(schema);
    if depth > 64
        || s.get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true)
    {
        return;
    }
    match v {
        Value::Object(m) => {
            let props = s.get("properties").and_then(Value::as_object);
            let extra = s.get("additionalProperties");
            for (k, c) in m {
                if k.starts_with('$') {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (props.and_then(|ps| ps.get(k)), extra) {
                    (Some(cs), _) => unknown_at(cs, c, &p, out, depth + 1),
                    (None, Some(a)) if a.is_object() => unknown_at(a, c, &p, out, depth + 1),
                    (None, Some(Value::Bool(true))) => {}
                    (None, _) if props.is_some() => out.push(p),
                    // An object schema without properties is free-form.
                    (None, _) => {}
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = s.get("items") {
                for (i, c) in a.iter().enumerate() {
                    unknown_at(items, c, &format!("{path}[{i}]"), out, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// Removes from `v` the fields [`unknown_fields`] reports.
pub fn drop_unknown(schema: &Value, v: &mut Value) {
    drop_at(schema, v, 0)
}

fn drop_at(schema: &Value, v: &mut Value, depth: usize) {
    let s = resolve(schema);
    if depth > 64
        || s.get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true)
    {
        return;
    }
    match v {
        Value::Object(m) => {
            let props = s.get("properties").and_then(Value::as_object);
            let extra = s.get("additionalProperties");
            m.retain(|k, _| {
                k.starts_with('$')
                    || props.is_none()
                    || props.is_some_and(|p| p.contains_key(k))
                    || extra.is_some_and(|a| a.is_object() || a == &Value::Bool(true))
            });
            for (k, c) in m.iter_mut() {
                match (props.and_then(|ps| ps.get(k)), extra) {
                    (Some(cs), _) => drop_at(cs, c, depth + 1),
                    (None, Some(a)) if a.is_object() => drop_at(a, c, depth + 1),
                    _ => {}
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = s.get("items") {
                for c in a {
                    drop_at(items, c, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// The OpenAPI name a CRD kind's schema is published under (`com.example.v1.Widget`).
fn crd_name(ri: &ResourceInfo) -> String {
    let rev: Vec<&str> = ri.group.split('.').rev().collect();
    format!("{}.{}.{}", rev.join("."), ri.version, ri.kind)
}

/// The `$ref` targets (definition names) found in `v`.
fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str)
                && let Some(n) = r.strip_prefix(V3_REFS)
            {
                out.push(n.to_string());
            }
            m.values().for_each(|x| refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

/// `roots` and every definition they refer to, transitively.
fn closure(roots: Vec<(String, Value)>) -> Map<String, Value> {
    let defs = &builtins().definitions;
    let mut out = Map::new();
    let mut todo: Vec<String> = Vec::new();
    for (n, v) in roots {
        refs(&v, &mut todo);
        out.insert(n, v);
    }
    let mut seen: BTreeSet<String> = out.keys().cloned().collect();
    while let Some(n) = todo.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        if let Some(v) = defs.get(&n) {
            refs(v, &mut todo);
            out.insert(n, v.clone());
        }
    }
    out
}

/// (definition name, schema) of each kind in `rs`.
fn kind_schemas(rs: &[&Arc<ResourceInfo>]) -> Vec<(String, Value)> {
    let b = builtins();
    let mut out = Vec::new();
    for r in rs {
        if let Some(s) = &r.schema {
            out.push((crd_name(r), crd_schema(r, s)));
        } else if let Some(n) = b
            .kinds
            .get(&(r.group.clone(), r.version.clone(), r.kind.clone()))
            && let Some(d) = b.definitions.get(n)
        {
            out.push((n.clone(), d.clone()));
        }
    }
    out
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per served group/version.
pub fn v3_root(all: &[Arc<ResourceInfo>]) -> Value {
    let mut paths = Map::new();
    for r in all {
        let p = gv_path(&r.group, &r.version);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=ebbsim")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/{api/v1|apis/g/v}`: each kind's item path with its PATCH operation (the query
/// parameters it accepts, so kubectl leaves field validation to the server, and the patch types
/// it takes), and the kinds' schemas with everything they refer to, for `kubectl explain`.
/// Strategic merge patch is not offered in the document, as the schemas do not carry the patch
/// strategies: kubectl then computes its patches from its own built-in types, as before.
pub fn v3_group(all: &[Arc<ResourceInfo>], path: &str) -> Option<Value> {
    let rs: Vec<&Arc<ResourceInfo>> = all
        .iter()
        .filter(|r| gv_path(&r.group, &r.version) == path)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force"]
        .iter()
        .map(|n| json!({"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    for r in &rs {
        let base = if r.namespaced {
            format!("/{path}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("/{path}/{}/{{name}}", r.plural)
        };
        let body = json!({"schema": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}});
        paths.insert(base, json!({"patch": {
            "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
            "x-kubernetes-action": "patch",
            "parameters": params,
            "requestBody": {"content": {
                "application/json-patch+json": body,
                "application/merge-patch+json": body,
                "application/apply-patch+yaml": body}},
            "responses": {"200": {"description": "OK"}}}}));
    }
    let mut schemas = closure(kind_schemas(&rs));
    schemas.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into(),
        json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}),
    );
    Some(json!({"openapi": "3.0.0",
        "info": {"title": "Kubernetes (ebb-sim)", "version": "v1.33.0"},
        "paths": paths, "components": {"schemas": schemas}}))
}

// ---- OpenAPI v2 as protobuf (gnostic's openapi_v2.Document, which kubectl reads) ----

/// The subset of gnostic's `openapi_v2` messages the simulator writes (field numbers as in
/// gnostic-models' OpenAPIv2.proto).
mod v2 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Document {
        #[prost(string, tag = "1")]
        pub swagger: String,
        #[prost(message, optional, tag = "2")]
        pub info: Option<Info>,
        #[prost(message, optional, tag = "8")]
        pub paths: Option<Paths>,
        #[prost(message, optional, tag = "9")]
        pub definitions: Option<Definitions>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Info {
        #[prost(string, tag = "1")]
        pub title: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Paths {}
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Definitions {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedSchema {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Schema>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "2")]
        pub yaml: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedAny {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Any>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeItem {
        #[prost(string, repeated, tag = "1")]
        pub value: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ItemsItem {
        #[prost(message, repeated, tag = "1")]
        pub schema: Vec<Schema>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Properties {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AdditionalPropertiesItem {
        #[prost(message, optional, boxed, tag = "1")]
        pub schema: Option<Box<Schema>>,
        #[prost(bool, optional, tag = "2")]
        pub boolean: Option<bool>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Schema {
        #[prost(string, tag = "1")]
        pub r#ref: String,
        #[prost(string, tag = "2")]
        pub format: String,
        #[prost(string, tag = "4")]
        pub description: String,
        #[prost(string, repeated, tag = "19")]
        pub required: Vec<String>,
        #[prost(message, repeated, tag = "20")]
        pub r#enum: Vec<Any>,
        #[prost(message, optional, boxed, tag = "21")]
        pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
        #[prost(message, optional, tag = "22")]
        pub r#type: Option<TypeItem>,
        #[prost(message, optional, tag = "23")]
        pub items: Option<ItemsItem>,
        #[prost(message, repeated, tag = "24")]
        pub all_of: Vec<Schema>,
        #[prost(message, optional, tag = "25")]
        pub properties: Option<Properties>,
        #[prost(message, repeated, tag = "31")]
        pub vendor_extension: Vec<NamedAny>,
    }
}

/// YAML text of a JSON value, as gnostic keeps vendor extensions and enum values.
fn yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).unwrap_or_else(|_| v.to_string())
}

fn v2_schema(s: &Value) -> v2::Schema {
    let str_of = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut out = v2::Schema {
        r#ref: str_of("$ref").replace(V3_REFS, V2_REFS),
        format: str_of("format"),
        description: str_of("description"),
        ..Default::default()
    };
    match s.get("type") {
        Some(Value::String(t)) => {
            out.r#type = Some(v2::TypeItem {
                value: vec![t.clone()],
            })
        }
        Some(Value::Array(ts)) => {
            out.r#type = Some(v2::TypeItem {
                value: ts
                    .iter()
                    .filter_map(Value::as_str)
                    .filter(|t| *t != "null")
                    .map(str::to_string)
                    .collect(),
            })
        }
        _ => {}
    }
    if let Some(r) = s.get("required").and_then(Value::as_array) {
        out.required = r
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        out.r#enum = e.iter().map(|v| v2::Any { yaml: yaml(v) }).collect();
    }
    if let Some(p) = s.get("properties").and_then(Value::as_object) {
        out.properties = Some(v2::Properties {
            additional_properties: p
                .iter()
                .map(|(k, v)| v2::NamedSchema {
                    name: k.clone(),
                    value: Some(v2_schema(v)),
                })
                .collect(),
        });
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            out.additional_properties = Some(Box::new(v2::AdditionalPropertiesItem {
                schema: None,
                boolean: Some(*b),
            }))
        }
        Some(a @ Value::Object(_)) => {
            out.additional_properties = Some(Box::new(v2::AdditionalPropertiesItem {
                schema: Some(Box::new(v2_schema(a))),
                boolean: None,
            }))
        }
        _ => {}
    }
    if let Some(i) = s.get("items") {
        out.items = Some(v2::ItemsItem {
            schema: vec![v2_schema(i)],
        });
    }
    for k in ["allOf", "anyOf", "oneOf"] {
        if let Some(a) = s.get(k).and_then(Value::as_array) {
            out.all_of.extend(a.iter().map(v2_schema));
        }
    }
    if let Some(o) = s.as_object() {
        for (k, v) in o.iter().filter(|(k, _)| k.starts_with("x-kubernetes-")) {
            out.vendor_extension.push(v2::NamedAny {
                name: k.clone(),
                value: Some(v2::Any { yaml: yaml(v) }),
            });
        }
    }
    out
}

/// `/openapi/v2` as the protobuf kubectl asks for: the definitions of every kind served (no
/// paths: kubectl then computes patches from its built-in types, as it does for v3).
pub fn v2_protobuf(all: &[Arc<ResourceInfo>]) -> Vec<u8> {
    use prost::Message;
    let rs: Vec<&Arc<ResourceInfo>> = all.iter().collect();
    let defs = closure(kind_schemas(&rs));
    let doc = v2::Document {
        swagger: "2.0".into(),
        info: Some(v2::Info {
            title: "Kubernetes (ebb-sim)".into(),
            version: "v1.33.0".into(),
        }),
        paths: Some(v2::Paths {}),
        definitions: Some(v2::Definitions {
            additional_properties: defs
                .iter()
                .map(|(k, v)| v2::NamedSchema {
                    name: k.clone(),
                    value: Some(v2_schema(v)),
                })
                .collect(),
        }),
    };
    doc.encode_to_vec()
}

/// `/openapi/v2` as JSON, for clients that do not ask for protobuf.
pub fn v2_json(all: &[Arc<ResourceInfo>]) -> Value {
    let rs: Vec<&Arc<ResourceInfo>> = all.iter().collect();
    let defs = Value::Object(closure(kind_schemas(&rs)));
    let text = defs.to_string().replace(V3_REFS, V2_REFS);
    let defs: Value = serde_json::from_str(&text).unwrap_or(defs);
    json!({"swagger": "2.0", "info": {"title": "Kubernetes (ebb-sim)", "version": "v1.33.0"},
        "paths": {}, "definitions": defs})
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn all() -> Vec<Arc<ResourceInfo>> {
        crate::registry::builtins()
            .into_iter()
            .map(Arc::new)
            .collect()
    }

    #[test]
    fn v3_group_has_the_kind_schema_and_what_it_refers_to() {
        let d = v3_group(&all(), "apis/apps/v1").unwrap();
        let schemas = d["components"]["schemas"].as_object().unwrap();
        let dep = &schemas["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            dep["x-kubernetes-group-version-kind"],
            json!([{"group": "apps", "version": "v1", "kind": "Deployment"}])
        );
        // Every ref resolves inside the document.
        let mut rs = Vec::new();
        refs(&d, &mut rs);
        assert!(rs.iter().any(|r| r == "io.k8s.api.core.v1.PodSpec"));
        for r in rs {
            assert!(schemas.contains_key(&r), "{r} is referred to but missing");
        }
        assert!(v3_group(&all(), "apis/nope/v1").is_none());
    }

    #[test]
    fn unknown_fields_are_found_where_a_schema_declares_none() {
        let ri = crate::registry::builtins()
            .into_iter()
            .find(|r| r.kind == "Deployment")
            .unwrap();
        let s = schema_of(&ri).unwrap();
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "a", "labels": {"any": "x"}, "bogus": 1},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}, "extra": true,
                "template": {"spec": {"containers": [{"name": "c", "image": "i", "imagee": "typo"}],
                    "$setElementOrder/containers": [{"name": "c"}]}}}});
        assert_eq!(
            unknown_fields(&s, &d),
            vec![
                "metadata.bogus",
                "spec.extra",
                "spec.template.spec.containers[0].imagee"
            ]
        );
        let mut pruned = d.clone();
        drop_unknown(&s, &mut pruned);
        assert!(unknown_fields(&s, &pruned).is_empty());
        assert_eq!(pruned["metadata"]["labels"], json!({"any": "x"}));
        assert_eq!(
            pruned["spec"]["template"]["spec"]["containers"][0],
            json!({"name": "c", "image": "i"})
        );
        let crd_ri = ResourceInfo {
            schema: Some(
                json!({"type": "object", "properties": {"spec": {"type": "object",
                "properties": {"n": {"type": "integer"}, "free": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}}}),
            ),
            builtin: false,
            ..ri
        };
        let s = schema_of(&crd_ri).unwrap();
        let o = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
            "spec": {"n": 1, "free": {"any": 1}, "m": 2}});
        assert_eq!(unknown_fields(&s, &o), vec!["spec.m"]);
    }

    #[test]
    fn v2_protobuf_round_trips_with_kinds_marked() {
        let bytes = v2_protobuf(&all());
        let doc = v2::Document::decode(bytes.as_slice()).unwrap();
        assert_eq!(doc.swagger, "2.0");
        let defs = doc.definitions.unwrap().additional_properties;
        let pod = defs
            .iter()
            .find(|d| d.name == "io.k8s.api.core.v1.Pod")
            .and_then(|d| d.value.clone())
            .unwrap();
        let gvk = pod
            .vendor_extension
            .iter()
            .find(|e| e.name == "x-kubernetes-group-version-kind")
            .unwrap();
        assert!(gvk.value.as_ref().unwrap().yaml.contains("kind: Pod"));
        let spec = pod
            .properties
            .unwrap()
            .additional_properties
            .into_iter()
            .find(|p| p.name == "spec")
            .unwrap();
        let spec_ref = spec.value.unwrap();
        assert!(
            spec_ref.r#ref == "#/definitions/io.k8s.api.core.v1.PodSpec"
                || spec_ref
                    .all_of
                    .iter()
                    .any(|s| s.r#ref == "#/definitions/io.k8s.api.core.v1.PodSpec"),
            "{spec_ref:?}"
        );
    }
}
