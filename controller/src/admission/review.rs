//! One AdmissionReview: read the API server's request, and build the answer from the patch
//! steering decided on (always allowed; the patch only when it has operations). No I/O.

use crate::cluster::CachedPod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use crate::metrics::SteeringAdmission;

/// A request body the webhook cannot read: answered 400 (the API server then fails open).
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    #[error(
        "the body is not an AdmissionReview of a pod (admission.k8s.io/v1; is the webhook configuration's rule for pods only?): {0}"
    )]
    NotAReview(#[source] serde_json::Error),
    #[error("the AdmissionReview carries no request")]
    NoRequest,
}

/// The request of an AdmissionReview of a pod, as the API server sends it to `/steer`.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<CachedPod>, BadReview> {
    let review: AdmissionReview<CachedPod> =
        serde_json::from_slice(body).map_err(BadReview::NotAReview)?;
    review.try_into().map_err(|_| BadReview::NoRequest)
}

/// The pod being created, when `request` creates one: the only requests steering looks at.
pub fn created_pod(request: &AdmissionRequest<CachedPod>) -> Option<&CachedPod> {
    match request.operation {
        Operation::Create => request.object.as_ref(),
        _ => None,
    }
}

/// The answer to `request`: allowed, with `patch` (JSONPatch) when it has operations, and how
/// to count it. Steering never refuses a pod.
pub fn answer(
    request: &AdmissionRequest<CachedPod>,
    patch: Option<json_patch::Patch>,
) -> (AdmissionReview<DynamicObject>, SteeringAdmission) {
    let allowed = AdmissionResponse::from(request);
    let (response, result) = match patch {
        Some(p) if !p.0.is_empty() => match allowed.clone().with_patch(p) {
            Ok(r) => (r, SteeringAdmission::patched),
            Err(e) => {
                tracing::error!(error = %e, uid = %request.uid, "the steering patch cannot be serialized; admitting the pod unchanged");
                (allowed, SteeringAdmission::error)
            }
        },
        _ => (allowed, SteeringAdmission::unchanged),
    };
    (response.into_review(), result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn review(operation: &str, object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop",
                "operation": operation,
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": object,
                "oldObject": null,
                "dryRun": false,
            }
        }))
        .unwrap()
    }

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "web-7d4b9-", "namespace": "shop",
                   "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9",
                       "uid": "u1", "controller": true}]},
               "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    /// The answer as the API server reads it (JSON).
    fn answered(body: &[u8], patch: Option<json_patch::Patch>) -> (Value, SteeringAdmission) {
        let request = parse(body).unwrap();
        let (review, result) = answer(&request, patch);
        (serde_json::to_value(review).unwrap(), result)
    }

    fn affinity_patch() -> json_patch::Patch {
        serde_json::from_value(json!([{"op": "add", "path": "/spec/affinity", "value": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
                "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}}]}}}]))
        .unwrap()
    }

    #[test]
    fn no_patch_admits_the_pod_unchanged() {
        let (out, result) = answered(&review("CREATE", pod()), None);
        assert_eq!(result, SteeringAdmission::unchanged);
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        let r = &out["response"];
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002", "{out}");
        assert_eq!(r["allowed"], true);
        assert!(
            r.get("patch").is_none() && r.get("patchType").is_none(),
            "{out}"
        );
        // An empty patch is no patch.
        let (out, result) = answered(&review("CREATE", pod()), Some(json_patch::Patch(vec![])));
        assert_eq!(result, SteeringAdmission::unchanged);
        assert!(out["response"].get("patch").is_none(), "{out}");
    }

    #[test]
    fn a_patch_is_sent_as_json_patch_and_the_pod_still_allowed() {
        let (out, result) = answered(&review("CREATE", pod()), Some(affinity_patch()));
        assert_eq!(result, SteeringAdmission::patched);
        let r = &out["response"];
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        // The patch bytes, as the API server decodes them ([]byte from JSON), are the RFC 6902
        // operations.
        let bytes: Vec<u8> = match &r["patch"] {
            Value::Array(a) => a.iter().map(|b| b.as_u64().unwrap() as u8).collect(),
            other => panic!("patch is {other}"),
        };
        let ops: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(ops[0]["op"], "add");
        assert_eq!(ops[0]["path"], "/spec/affinity");
        assert_eq!(
            ops[0]["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
            100
        );
    }

    #[test]
    fn only_creations_are_looked_at() {
        let create = parse(&review("CREATE", pod())).unwrap();
        assert!(created_pod(&create).is_some());
        let update = parse(&review("UPDATE", pod())).unwrap();
        assert!(created_pod(&update).is_none());
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        for body in [
            &b""[..],
            b"not json",
            b"{}",
            b"[1,2,3]",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}"#,
        ] {
            assert!(parse(body).is_err(), "{}", String::from_utf8_lossy(body));
        }
        let err =
            parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).unwrap_err();
        assert!(matches!(err, BadReview::NoRequest), "{err}");
        // A pod object that is not a pod.
        let err = parse(&review("CREATE", json!({"spec": {"containers": "nope"}}))).unwrap_err();
        assert!(
            err.to_string().contains("AdmissionReview of a pod"),
            "{err}"
        );
    }
}
