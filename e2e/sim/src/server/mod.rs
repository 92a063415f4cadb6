//! The HTTP front of the simulator (axum): routes Kubernetes API paths to [`crate::api::Api`],
//! negotiates JSON/Table output, streams watches, and answers errors as `Status` objects.

pub mod discovery;
pub mod table;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::api::{Api, Ctx, DeleteOpts, Deleted, PatchKind};
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::EventType;

/// The router serving `api`.
pub fn router(api: Arc<Api>) -> Router {
    Router::new().fallback(handle).with_state(api)
}

fn json_response(code: u16, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `/openapi/v2`: protobuf (what kubectl asks for), JSON to other clients.
fn openapi_v2(all: &[Arc<ResourceInfo>], headers: &HeaderMap) -> Response {
    // kubectl asks for `...spec.v2@v1.0+protobuf`; servers answer with this (a valid media type).
    const PB: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("protobuf") {
        let mut r = Response::new(Body::from(crate::openapi::v2_protobuf(all)));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PB));
        return r;
    }
    json_response(200, &crate::openapi::v2_json(all))
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &e.status())
}

/// Who the request is from: the bearer token names the user (`Bearer alice` → `alice`), or the
/// `X-Remote-User` header; otherwise `admin`.
fn user_of(headers: &HeaderMap) -> String {
    if let Some(t) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        && let Some(tok) = t.strip_prefix("Bearer ")
    {
        return tok.trim().to_string();
    }
    headers
        .get("x-remote-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("admin")
        .to_string()
}

fn manager_of(q: &HashMap<String, String>, headers: &HeaderMap) -> String {
    if let Some(m) = q.get("fieldManager") {
        return m.clone();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .unwrap_or("unknown")
        .to_string()
}

/// Parsed resource path.
struct Target {
    ri: Arc<ResourceInfo>,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch_path: bool,
}

fn parse_target(api: &Api, path: &str) -> Result<Option<Target>, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return Ok(None),
    };
    let (watch_path, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, r, tail @ ..] if *r != "status" && *r != "finalize" => {
            (Some(ns.to_string()), {
                let mut v = vec![*r];
                v.extend_from_slice(tail);
                v
            })
        }
        r => (None, r.to_vec()),
    };
    if rest.is_empty() || rest.len() > 3 {
        return Err(ApiError::not_found_path(path));
    }
    let ri = api
        .resolve(group, version, rest[0])
        .ok_or_else(|| ApiError::not_found_path(path))?;
    if ns.is_some() && !ri.namespaced {
        return Err(ApiError::not_found_path(path));
    }
    Ok(Some(Target {
        ri,
        ns,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
        watch_path,
    }))
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| {
            a.split(',')
                .next()
                .is_some_and(|first| first.contains("as=Table"))
        })
}

async fn handle(
    State(api): State<Arc<Api>>,
    method: Method,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    tracing::debug!(%method, %path, "request");
    match route(&api, &method, &path, &q, &headers, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn route(
    api: &Arc<Api>,
    method: &Method,
    path: &str,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let trimmed = path.trim_end_matches('/');
    if method == Method::GET {
        let all = api.all_resources();
        match trimmed {
            "/version" => return Ok(json_response(200, &discovery::version())),
            "/healthz" | "/readyz" | "/livez" => return Ok((StatusCode::OK, "ok").into_response()),
            "/api" => return Ok(json_response(200, &discovery::core_versions())),
            "/apis" => return Ok(json_response(200, &discovery::group_list(&all))),
            "/openapi/v3" => return Ok(json_response(200, &crate::openapi::v3_root(&all))),
            "/openapi/v2" => return Ok(openapi_v2(&all, headers)),
            _ => {}
        }
        if let Some(gv) = trimmed.strip_prefix("/openapi/v3/") {
            return crate::openapi::v3_group(&all, gv)
                .map(|d| json_response(200, &d))
                .ok_or_else(|| ApiError::not_found_path(path));
        }
        let segs: Vec<&str> = trimmed.trim_start_matches('/').split('/').collect();
        match segs.as_slice() {
            ["api", v] => {
                return discovery::resource_list(&all, "", v)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(|| ApiError::not_found_path(path));
            }
            ["apis", g] => {
                return discovery::group(&all, g)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(|| ApiError::not_found_path(path));
            }
            ["apis", g, v] => {
                return discovery::resource_list(&all, g, v)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(|| ApiError::not_found_path(path));
            }
            _ => {}
        }
    }
    let Some(t) = parse_target(api, trimmed)? else {
        return Err(ApiError::not_found_path(path));
    };
    let ctx = Ctx {
        user: user_of(headers),
        manager: manager_of(q, headers),
        dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
    };
    let ri = t.ri.clone();
    let ns_s = t.ns.clone().unwrap_or_default();
    let sub = t.sub.clone().unwrap_or_default();
    if !sub.is_empty() {
        let ok = match sub.as_str() {
            "status" => ri.status_subresource,
            "eviction" | "binding" => ri.group.is_empty() && ri.plural == "pods",
            "scale" => has_scale(&ri),
            _ => false,
        };
        if !ok {
            return Err(ApiError::not_found_path(path));
        }
        if let ("scale", Some(name)) = (sub.as_str(), t.name.as_deref()) {
            return scale(api, &ctx, &ri, &ns_s, name, method, headers, &body);
        }
    }
    let body_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let parse_body = || -> ApiResult<Value> {
        if body_type.contains("protobuf") {
            return crate::protobuf::decode(&body)
                .map_err(|e| ApiError::unsupported_media(e.to_string()));
        }
        if body_type.contains("cbor") {
            return Err(ApiError::unsupported_media(format!(
                "the body of the request was in an unknown format ({body_type}) - accepted media types include: application/json, application/yaml"
            )));
        }
        if body.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&body).or_else(|_| {
            std::str::from_utf8(&body)
                .ok()
                .and_then(|s| serde_saphyr::from_str::<Value>(s).ok())
                .ok_or_else(|| {
                    ApiError::bad_request("the request body is neither valid JSON nor YAML")
                })
        })
    };
    let table = wants_table(headers);
    let include = q
        .get("includeObject")
        .cloned()
        .unwrap_or_else(|| "Metadata".into());
    let one = |o: &Arc<Value>, code: u16| -> Response {
        if table {
            json_response(
                code,
                &table::table(
                    &ri,
                    std::slice::from_ref(o),
                    &include,
                    api.clock.now(),
                    None,
                    None,
                ),
            )
        } else {
            json_response(code, o)
        }
    };
    // Field validation (`fieldValidation`: Strict refuses unknown fields, Warn — the default —
    // answers them in Warning headers, Ignore says nothing) of what a write sends.
    let mut warnings: Vec<String> = Vec::new();
    let mut sent_body: Option<Value> = None;
    let mut patch_body: Option<Bytes> = None;
    let writes = matches!(
        (method.clone(), t.name.as_deref(), sub.as_str()),
        (Method::POST, None, _)
            | (Method::PUT, Some(_), "" | "status")
            | (Method::PATCH, Some(_), "" | "status")
    );
    let json_patch = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json-patch+json"));
    if writes && !json_patch {
        let mode = q
            .get("fieldValidation")
            .map(String::as_str)
            .unwrap_or("Warn");
        if let Some(schema) = crate::openapi::schema_of(&ri) {
            let sent = if method == Method::PATCH {
                serde_json::from_slice::<Value>(&body).ok().or_else(|| {
                    std::str::from_utf8(&body)
                        .ok()
                        .and_then(|s| serde_saphyr::from_str::<Value>(s).ok())
                })
            } else {
                parse_body().ok()
            };
            let unknown = sent
                .as_ref()
                .map(|v| crate::openapi::unknown_fields(&schema, v))
                .unwrap_or_default();
            // A built-in kind keeps only the fields its type has, as the real decoder does
            // (CRDs are pruned by their structural schema on admission).
            if let Some(mut v) = sent
                && ri.builtin
            {
                if !unknown.is_empty() {
                    crate::openapi::drop_unknown(&schema, &mut v);
                }
                if method == Method::PATCH {
                    if !unknown.is_empty() {
                        patch_body = Some(Bytes::from(serde_json::to_vec(&v).unwrap_or_default()));
                    }
                } else {
                    sent_body = Some(v);
                }
            }
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            // Server-side apply refuses undeclared fields whatever fieldValidation says, with
            // the real server's code and words.
            if let (true, Some(first), Some(name)) = (
                ct.starts_with("application/apply-patch"),
                unknown.first(),
                t.name.as_deref(),
            ) {
                return Err(ApiError::new(
                    500,
                    "",
                    format!(
                        "failed to create typed patch object ({ns_s}/{name}; {}, Kind={}): .{first}: field not declared in schema",
                        if ri.group.is_empty() {
                            format!("/{}", ri.version)
                        } else {
                            ri.api_version()
                        },
                        ri.kind
                    ),
                ));
            }
            if !unknown.is_empty() && mode != "Ignore" {
                let listed: Vec<String> = unknown
                    .iter()
                    .map(|f| format!("unknown field {f:?}"))
                    .collect();
                if mode == "Strict" && method == Method::PATCH {
                    // A patch is judged on what it makes: 422 with the patch as the invalid value.
                    let text = format!(
                        "Invalid value: {:?}: strict decoding error: {}",
                        String::from_utf8_lossy(&body),
                        listed.join(", ")
                    );
                    let mut e =
                        ApiError::new(422, "Invalid", format!(" \"\" is invalid: patch: {text}"));
                    e.details = Some(
                        json!({"causes": [{"reason": "FieldValueInvalid", "message": text, "field": "patch"}]}),
                    );
                    return Err(e);
                }
                if mode == "Strict" {
                    return Err(ApiError::bad_request(format!(
                        "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                        listed.join(", "),
                        kind = ri.kind,
                        version = ri.version
                    )));
                }
                warnings = listed;
            }
        }
    }
    let mut resp = match (method.clone(), t.name.as_deref()) {
        (Method::GET, None) => {
            let labels =
                LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let fields =
                FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let watch = t.watch_path || q.get("watch").is_some_and(|w| w == "true" || w == "1");
            if watch {
                return watch_response(api.clone(), ri, t.ns, labels, fields, q, table, include);
            }
            let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok());
            let page = api.list(
                &ri,
                t.ns.as_deref(),
                &labels,
                &fields,
                limit,
                q.get("continue").map(String::as_str),
            )?;
            let rv = page.resource_version.to_string();
            if table {
                return Ok(json_response(
                    200,
                    &table::table(
                        &ri,
                        &page.items,
                        &include,
                        api.clock.now(),
                        Some(&rv),
                        page.continue_token.as_deref(),
                    ),
                ));
            }
            let mut meta = json!({"resourceVersion": rv});
            if let Some(c) = &page.continue_token {
                meta["continue"] = json!(c);
            }
            Ok(list_response(&ri, meta, &page.items))
        }
        (Method::GET, Some(name)) => Ok(one(&api.get(&ri, &ns_s, name)?, 200)),
        (Method::POST, None) => {
            let b = sent_body.take().map(Ok).unwrap_or_else(parse_body)?;
            let o = api.create(&ctx, &ri, &ns_s, b)?;
            Ok(one(&o, 201))
        }
        (Method::POST, Some(name)) if sub == "eviction" => {
            let b = parse_body()?;
            Ok(json_response(201, &api.evict(&ctx, &ri, &ns_s, name, &b)?))
        }
        (Method::POST, Some(name)) if sub == "binding" => {
            let b = parse_body()?;
            let node = b
                .pointer("/target/name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request("binding.target.name is required"))?;
            api.bind(&ctx, &ri, &ns_s, name, node)?;
            Ok(json_response(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (Method::PUT, Some(name)) => Ok(one(
            &api.update(
                &ctx,
                &ri,
                &ns_s,
                name,
                &sub,
                sent_body.take().map(Ok).unwrap_or_else(parse_body)?,
            )?,
            200,
        )),
        (Method::PATCH, Some(name)) => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let ct = ct.split(';').next().unwrap_or("").trim();
            let kind = match ct {
                "application/merge-patch+json" => PatchKind::Merge,
                "application/json-patch+json" => PatchKind::Json,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/apply-patch+yaml"
                | "application/apply-patch+json"
                | "application/apply-patch+cbor" => PatchKind::Apply {
                    force: q.get("force").is_some_and(|f| f == "true"),
                },
                other => {
                    return Err(ApiError::unsupported_media(format!(
                        "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                    )));
                }
            };
            let created = api.get(&ri, &ns_s, name).is_err();
            let o = api.patch(
                &ctx,
                &ri,
                &ns_s,
                name,
                &sub,
                kind,
                patch_body.as_ref().unwrap_or(&body),
            )?;
            Ok(one(&o, if created { 201 } else { 200 }))
        }
        (Method::DELETE, Some(name)) => {
            let mut opts = DeleteOpts::from_body(&parse_body()?);
            if let Some(g) = q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
                opts.grace = Some(g);
            }
            if let Some(p) = q.get("propagationPolicy") {
                opts.propagation = Some(p.clone());
            }
            let d = api.delete(&ctx, &ri, &ns_s, name, &opts)?;
            let code = match d {
                Deleted::Gone(_) => 200,
                Deleted::Pending(_) => 200,
            };
            Ok(json_response(code, d.object()))
        }
        (Method::DELETE, None) => {
            let labels =
                LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let fields =
                FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let mut opts = DeleteOpts::from_body(&parse_body()?);
            if let Some(g) = q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
                opts.grace = Some(g);
            }
            let gone =
                api.delete_collection(&ctx, &ri, t.ns.as_deref(), &labels, &fields, &opts)?;
            Ok(list_response(
                &ri,
                json!({"resourceVersion": api.resource_version().to_string()}),
                &gone,
            ))
        }
        (m, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method ({m}) on the requested resource"
        ))),
    }?;
    for w in warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - {:?}", w)) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    Ok(resp)
}

/// Kinds with a `scale` subresource.
pub fn has_scale(ri: &ResourceInfo) -> bool {
    ri.group == "apps"
        && matches!(
            ri.plural.as_str(),
            "deployments" | "replicasets" | "statefulsets"
        )
}

/// The `autoscaling/v1` Scale of a workload object.
fn scale_view(o: &Value) -> Value {
    let m = &o["metadata"];
    let selector: Vec<String> = o
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
            "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
        "spec": {"replicas": o.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {"replicas": o.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector.join(",")}})
}

/// GET, PUT and PATCH of `.../{deployments|replicasets|statefulsets}/{name}/scale`: a write
/// sets the object's `spec.replicas` (checking `metadata.resourceVersion` when sent).
#[allow(clippy::too_many_arguments)]
fn scale(
    api: &Arc<Api>,
    ctx: &Ctx,
    ri: &ResourceInfo,
    ns: &str,
    name: &str,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Response> {
    let current = api.get(ri, ns, name)?;
    let mut view = scale_view(&current);
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let sent = || -> ApiResult<Value> {
        if ct.contains("protobuf") {
            return crate::protobuf::decode(body)
                .map_err(|e| ApiError::unsupported_media(e.to_string()));
        }
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))
    };
    match *method {
        Method::GET => return Ok(json_response(200, &view)),
        Method::PUT => view = sent()?,
        Method::PATCH => {
            let p = sent()?;
            if ct.starts_with("application/json-patch+json") {
                crate::patch::json(&mut view, &p)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
            } else {
                crate::patch::merge(&mut view, &p);
            }
        }
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method ({method}) on the scale subresource"
            )));
        }
    }
    if let Some(rv) = view
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        && Some(rv)
            != current
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
    {
        return Err(ApiError::conflict(ri, name));
    }
    let replicas = view
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .ok_or_else(|| ApiError::bad_request("spec.replicas of the Scale is required"))?;
    let patch = serde_json::to_vec(&json!({"spec": {"replicas": replicas}})).unwrap_or_default();
    let o = api.patch(ctx, ri, ns, name, "", PatchKind::Merge, &patch)?;
    Ok(json_response(200, &scale_view(&o)))
}

fn list_response(ri: &ResourceInfo, meta: Value, items: &[Arc<Value>]) -> Response {
    // Serialise without cloning the stored objects.
    let mut out = Vec::with_capacity(items.len() * 512 + 256);
    out.extend_from_slice(b"{\"kind\":");
    out.extend_from_slice(json!(format!("{}List", ri.kind)).to_string().as_bytes());
    out.extend_from_slice(b",\"apiVersion\":");
    out.extend_from_slice(json!(ri.api_version()).to_string().as_bytes());
    out.extend_from_slice(b",\"metadata\":");
    out.extend_from_slice(meta.to_string().as_bytes());
    out.extend_from_slice(b",\"items\":[");
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, &**o);
    }
    out.extend_from_slice(b"]}");
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn event_line(
    kind: &str,
    object: &Value,
    ri: &ResourceInfo,
    table: bool,
    include: &str,
    api: &Api,
) -> Bytes {
    let obj = if table && kind != "BOOKMARK" && kind != "ERROR" {
        table::table(
            ri,
            &[Arc::new(object.clone())],
            include,
            api.clock.now(),
            None,
            None,
        )
    } else {
        object.clone()
    };
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

#[allow(clippy::too_many_arguments)]
fn watch_response(
    api: Arc<Api>,
    ri: Arc<ResourceInfo>,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    q: &HashMap<String, String>,
    table: bool,
    include: String,
) -> ApiResult<Response> {
    let res = (ri.group.clone(), ri.plural.clone());
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let send_initial = q.get("sendInitialEvents").is_some_and(|s| s == "true");
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|s| s == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let matches = {
        let ns = ns.clone();
        move |o: &Value| -> bool {
            if let Some(n) = &ns
                && o.pointer("/metadata/namespace").and_then(Value::as_str) != Some(n.as_str())
            {
                return false;
            }
            labels.matches_object(o) && fields.matches(o)
        }
    };
    let initial_list = rv_param.is_empty() || rv_param == "0" || send_initial;
    let (initial, since) = if initial_list {
        let page = api.list(
            &ri,
            ns.as_deref(),
            &LabelSelector::default(),
            &FieldSelector::default(),
            None,
            None,
        )?;
        (page.items, page.resource_version)
    } else {
        let since = rv_param
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv_param:?}")))?;
        (Vec::new(), since)
    };
    let subscription = api.watch_from(&res, since);
    let api2 = api.clone();
    tokio::spawn(async move {
        let (past, mut sub) = match subscription {
            Ok(s) => s,
            Err(e) => {
                let _ = tx
                    .send(event_line("ERROR", &e.status(), &ri, false, "", &api2))
                    .await;
                return;
            }
        };
        for o in initial.iter().filter(|o| matches(o)) {
            if tx
                .send(event_line("ADDED", o, &ri, table, &include, &api2))
                .await
                .is_err()
            {
                return;
            }
        }
        let mut last = since;
        if send_initial {
            let bm = json!({"kind": ri.kind, "apiVersion": ri.api_version(), "metadata": {
                "resourceVersion": since.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}});
            if tx
                .send(event_line("BOOKMARK", &bm, &ri, false, "", &api2))
                .await
                .is_err()
            {
                return;
            }
        }
        let emit = |ev: &crate::store::Event| -> Option<(&'static str, Arc<Value>)> {
            let now_m = matches(&ev.object);
            let old_m = ev.old.as_ref().is_some_and(|o| matches(o));
            match ev.kind {
                EventType::Added if now_m => Some(("ADDED", ev.object.clone())),
                EventType::Modified if now_m && old_m => Some(("MODIFIED", ev.object.clone())),
                EventType::Modified if now_m => Some(("ADDED", ev.object.clone())),
                EventType::Modified if old_m => Some(("DELETED", ev.object.clone())),
                EventType::Deleted if old_m || now_m => Some(("DELETED", ev.object.clone())),
                _ => None,
            }
        };
        for ev in past {
            if let Some((k, o)) = emit(&ev)
                && tx
                    .send(event_line(k, &o, &ri, table, &include, &api2))
                    .await
                    .is_err()
            {
                return;
            }
            last = ev.rv;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        loop {
            tokio::select! {
                r = sub.recv() => match r {
                    Ok(ev) => {
                        if ev.rv <= last { continue; }
                        last = ev.rv;
                        if let Some((k, o)) = emit(&ev)
                            && tx.send(event_line(k, &o, &ri, table, &include, &api2)).await.is_err()
                        {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(resource = %ri.qualified(), missed = n, "watcher fell behind; closing its watch");
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let bm = json!({"kind": ri.kind, "apiVersion": ri.api_version(), "metadata": {"resourceVersion": last.max(api2.resource_version()).to_string()}});
                    if tx.send(event_line("BOOKMARK", &bm, &ri, false, "", &api2)).await.is_err() { return; }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::io::Error>(b), rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}
