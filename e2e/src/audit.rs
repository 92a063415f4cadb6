//! The real kube-apiserver's audit log (`DIR/audit.log`, JSON lines) read as the same
//! [`AuditRecord`]s ebb-sim keeps, so tests judge both backends with one set of checks.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use ebb_sim::AuditRecord;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    stage_timestamp: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    user: User,
    #[serde(default)]
    impersonated_user: Option<User>,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<Status>,
}

#[derive(Deserialize, Default)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    api_group: String,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    code: u16,
}

/// Parses audit-log text: one record per completed request (`ResponseComplete`, or `Panic`),
/// in the order the API server wrote them. `resource` is `plural` for the core group and
/// `plural.group` otherwise, as ebb-sim writes it; `user` is the impersonated user when the
/// request impersonated one. Lines that are not JSON audit events fail.
pub fn parse(text: &str) -> anyhow::Result<Vec<AuditRecord>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Event = serde_json::from_str(line)
            .with_context(|| format!("audit log line {} is not an audit event", i + 1))?;
        if e.stage != "ResponseComplete" && e.stage != "Panic" {
            continue;
        }
        let o = e.object_ref.unwrap_or_default();
        let resource = if o.api_group.is_empty() {
            o.resource
        } else {
            format!("{}.{}", o.resource, o.api_group)
        };
        out.push(AuditRecord {
            time: e.stage_timestamp,
            // The identity the request acted as.
            user: e
                .impersonated_user
                .map(|u| u.username)
                .filter(|u| !u.is_empty())
                .unwrap_or(e.user.username),
            verb: e.verb,
            resource,
            subresource: o.subresource,
            namespace: o.namespace,
            name: o.name,
            code: e.response_status.map_or(0, |s| s.code),
        });
    }
    Ok(out)
}

/// An eviction as the audit log records it, with the pod uid of its precondition (ebb sends
/// one with every eviction; empty when the request carried none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRecord {
    pub user: String,
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    pub code: u16,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct EvictionEvent {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    user: User,
    #[serde(default)]
    impersonated_user: Option<User>,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<Status>,
    #[serde(default)]
    request_object: Option<serde_json::Value>,
}

/// The completed evictions of audit-log text, in order, with their precondition uids (the
/// cluster's audit policy logs eviction request bodies). Lines that are not JSON fail.
pub fn evictions(text: &str) -> anyhow::Result<Vec<EvictionRecord>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: EvictionEvent = serde_json::from_str(line)
            .with_context(|| format!("audit log line {} is not an audit event", i + 1))?;
        let o = e.object_ref.unwrap_or_default();
        if (e.stage != "ResponseComplete" && e.stage != "Panic") || o.subresource != "eviction" {
            continue;
        }
        let uid = e
            .request_object
            .as_ref()
            .and_then(|r| r.pointer("/deleteOptions/preconditions/uid"))
            .and_then(|u| u.as_str())
            .unwrap_or_default()
            .to_string();
        out.push(EvictionRecord {
            user: e
                .impersonated_user
                .map(|u| u.username)
                .filter(|u| !u.is_empty())
                .unwrap_or(e.user.username),
            pod: format!("{}/{}", o.namespace, o.name),
            uid,
            code: e.response_status.map_or(0, |s| s.code),
        });
    }
    Ok(out)
}

/// Pod uids (or `namespace/name` when an eviction named no uid) accepted for eviction more than
/// once, with their counts.
pub fn evicted_twice_by_uid(
    records: &[EvictionRecord],
) -> std::collections::BTreeMap<String, usize> {
    let mut n = std::collections::BTreeMap::new();
    for r in records.iter().filter(|r| (200..300).contains(&r.code)) {
        let key = if r.uid.is_empty() {
            r.pod.clone()
        } else {
            format!("{} ({})", r.uid, r.pod)
        };
        *n.entry(key).or_insert(0) += 1;
    }
    n.retain(|_, c| *c > 1);
    n
}

/// Reads and parses the audit log at `path`.
pub fn read(path: &Path) -> anyhow::Result<Vec<AuditRecord>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the audit log {}", path.display()))?;
    parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eviction_and_a_node_delete_are_read_in_order() {
        let text = r#"{"kind":"Event","stage":"ResponseStarted","verb":"create","user":{"username":"x"}}
{"kind":"Event","stage":"ResponseComplete","stageTimestamp":"2026-11-23T10:00:00.000001Z","verb":"create","user":{"username":"system:serviceaccount:ebb-system:ebb-controller"},"objectRef":{"resource":"pods","subresource":"eviction","namespace":"default","name":"web-1","apiVersion":"v1"},"responseStatus":{"code":429}}
{"kind":"Event","stage":"ResponseComplete","stageTimestamp":"2026-11-23T10:00:01Z","verb":"delete","user":{"username":"admin"},"objectRef":{"resource":"nodes","name":"n1","apiVersion":"v1"},"responseStatus":{"code":200}}
{"kind":"Event","stage":"ResponseComplete","verb":"patch","user":{"username":"a"},"objectRef":{"resource":"scaledownpolicies","subresource":"status","name":"p","apiGroup":"ebb.dev"},"responseStatus":{"code":201}}
"#;
        let r = parse(text).unwrap();
        assert_eq!(r.len(), 3, "the ResponseStarted stage is not a record");
        assert_eq!(
            (
                r[0].verb.as_str(),
                r[0].resource.as_str(),
                r[0].subresource.as_str()
            ),
            ("create", "pods", "eviction")
        );
        assert_eq!(
            (r[0].namespace.as_str(), r[0].name.as_str(), r[0].code),
            ("default", "web-1", 429)
        );
        assert_eq!(r[0].user, "system:serviceaccount:ebb-system:ebb-controller");
        assert_eq!(
            (r[1].resource.as_str(), r[1].name.as_str(), r[1].code),
            ("nodes", "n1", 200)
        );
        assert_eq!(r[2].resource, "scaledownpolicies.ebb.dev");
        assert_eq!(r[2].subresource, "status");
    }

    #[test]
    fn an_impersonated_request_is_recorded_as_the_impersonated_user() {
        let text = r#"{"stage":"ResponseComplete","verb":"patch","user":{"username":"kubernetes-admin"},"impersonatedUser":{"username":"ctl-a","groups":["system:masters"]},"objectRef":{"resource":"nodes","name":"n1"},"responseStatus":{"code":200}}"#;
        assert_eq!(parse(text).unwrap()[0].user, "ctl-a");
    }

    #[test]
    fn evictions_are_counted_per_pod_uid() {
        let line = |name: &str, uid: &str, code: u16| {
            format!(
                r#"{{"stage":"ResponseComplete","verb":"create","user":{{"username":"u"}},"objectRef":{{"resource":"pods","subresource":"eviction","namespace":"default","name":"{name}"}},"responseStatus":{{"code":{code}}},"requestObject":{{"kind":"Eviction","deleteOptions":{{"preconditions":{{"uid":"{uid}"}}}}}}}}"#
            )
        };
        let text = [
            line("a", "u1", 201),
            line("a", "u1", 429),
            line("a", "u2", 201), // same name, new pod
            line("b", "u3", 201),
            line("b", "u3", 201),
        ]
        .join("\n");
        let r = evictions(&text).unwrap();
        assert_eq!(r.len(), 5);
        assert_eq!(r[0].uid, "u1");
        assert_eq!(
            evicted_twice_by_uid(&r),
            std::collections::BTreeMap::from([("u3 (default/b)".to_string(), 2)])
        );
    }

    #[test]
    fn a_line_that_is_not_an_audit_event_is_an_error() {
        let err = parse("{\"stage\":\"ResponseComplete\"}\nnot json\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}
