//! The leader's own Pod carries `ebb.dev/leader=true`, which the webhook's Service selects, so
//! the API server calls the replica that holds the plan; set when leading, removed on stopping.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// The label the chart's steering Service selects (`"true"` on the leader's Pod only).
pub const LEADER_LABEL: &str = "ebb.dev/leader";

/// This replica's Pod (from the downward API: `POD_NAME`, `POD_NAMESPACE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl PodRef {
    /// The Pod named `pod_name` in `namespace`; `None` without a name (out of a cluster, where
    /// there is no Pod to label).
    pub fn new(namespace: &str, pod_name: Option<&str>) -> Option<Self> {
        let name = pod_name.map(str::trim).filter(|n| !n.is_empty())?;
        Some(Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// The Pod named by the `POD_NAME` environment variable (set by the chart) in `namespace`.
    pub fn from_env(namespace: &str) -> Option<Self> {
        Self::new(namespace, std::env::var("POD_NAME").ok().as_deref())
    }
}

/// The merge patch that sets (`leader`) or removes the label.
pub fn label_patch(leader: bool) -> Value {
    let value = if leader { json!("true") } else { Value::Null };
    json!({"metadata": {"labels": {LEADER_LABEL: value}}})
}

/// Whether the label was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Labelled {
    Written,
    /// No such Pod (a `POD_NAME` that names no Pod of the namespace): nothing to label.
    NoPod,
}

/// Sets or removes the leader label on `pod`.
pub async fn set_leader_label(
    client: &kube::Client,
    pod: &PodRef,
    leader: bool,
) -> Result<Labelled, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    match api
        .patch(
            &pod.name,
            &PatchParams::default(),
            &Patch::Merge(label_patch(leader)),
        )
        .await
    {
        Ok(_) => Ok(Labelled::Written),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Labelled::NoPod),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use axum::http::Request;
    use http_body_util::BodyExt;
    use kube::client::Body;

    use super::*;

    #[test]
    fn the_pod_comes_from_the_downward_api_or_is_absent() {
        assert_eq!(
            PodRef::new("ebb-system", Some("ebb-controller-5d8f-x2x")),
            Some(PodRef {
                namespace: "ebb-system".into(),
                name: "ebb-controller-5d8f-x2x".into()
            })
        );
        assert_eq!(PodRef::new("ebb-system", None), None);
        assert_eq!(PodRef::new("ebb-system", Some("  ")), None);
    }

    #[test]
    fn the_patches_set_and_remove_exactly_the_label() {
        assert_eq!(
            label_patch(true),
            json!({"metadata": {"labels": {"ebb.dev/leader": "true"}}})
        );
        // A merge patch's null removes the key.
        let mut pod = json!({"metadata": {"labels": {"app": "ebb", "ebb.dev/leader": "true"}}});
        json_patch::merge(&mut pod, &label_patch(false));
        assert_eq!(pod, json!({"metadata": {"labels": {"app": "ebb"}}}));
    }

    /// A pod API that keeps `pod` (or has none) and applies the merge patches it receives.
    fn api(pod: Option<Value>, sent: Arc<Mutex<Vec<(String, String)>>>) -> kube::Client {
        let state = Arc::new(Mutex::new(pod));
        let svc = tower::service_fn(move |req: Request<Body>| {
            let state = state.clone();
            let sent = sent.clone();
            async move {
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                sent.lock()
                    .unwrap()
                    .push((path, String::from_utf8_lossy(&body).into_owned()));
                let mut state = state.lock().unwrap();
                let (code, out) = match state.as_mut() {
                    Some(p) => {
                        let patch: Value = serde_json::from_slice(&body).unwrap();
                        json_patch::merge(p, &patch);
                        (200, p.clone())
                    }
                    None => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "NotFound", "code": 404, "message": "pods not found"}),
                    ),
                };
                Ok::<_, Infallible>(crate::testkit::api::json_response(code, &out))
            }
        });
        kube::Client::new(svc, "default")
    }

    #[tokio::test]
    async fn the_label_goes_on_and_off_the_own_pod_only() {
        let sent = Arc::default();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ctl-0", "namespace": "ebb-system", "labels": {"app": "ebb"}}});
        let client = api(Some(pod), Arc::clone(&sent));
        let me = PodRef::new("ebb-system", Some("ctl-0")).unwrap();
        assert_eq!(
            set_leader_label(&client, &me, true).await.unwrap(),
            Labelled::Written
        );
        assert_eq!(
            set_leader_label(&client, &me, false).await.unwrap(),
            Labelled::Written
        );
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].0, "/api/v1/namespaces/ebb-system/pods/ctl-0");
        assert_eq!(
            sent[0].1,
            r#"{"metadata":{"labels":{"ebb.dev/leader":"true"}}}"#
        );
        assert_eq!(
            sent[1].1,
            r#"{"metadata":{"labels":{"ebb.dev/leader":null}}}"#
        );
    }

    #[tokio::test]
    async fn a_name_that_is_no_pod_is_skipped() {
        let client = api(None, Arc::default());
        let me = PodRef::new("ebb-system", Some("not-a-pod")).unwrap();
        assert_eq!(
            set_leader_label(&client, &me, true).await.unwrap(),
            Labelled::NoPod
        );
    }
}
