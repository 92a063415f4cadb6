//! The MutatingWebhookConfiguration the chart installs: whether it is there (steering is off
//! without it), and pointing its webhooks at this replica (CA bundle; URL out of a cluster).

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::SteeringAvailability;

/// The configuration could not be pointed at this replica.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("the MutatingWebhookConfiguration {name} is gone")]
    Gone { name: String },
    #[error("the MutatingWebhookConfiguration {name} has no webhooks")]
    NoWebhooks { name: String },
    #[error(
        "cannot read or patch the MutatingWebhookConfiguration {name} (the controller needs get and patch on it: see the chart's ClusterRole): {source}"
    )]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Whether the configuration `name` exists with at least one webhook (read once at start).
pub async fn check(client: &kube::Client, name: &str) -> SteeringAvailability {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    match api.get_opt(name).await {
        Ok(Some(c)) if c.webhooks.as_ref().is_some_and(|w| !w.is_empty()) => {
            SteeringAvailability::Enabled
        }
        Ok(Some(_)) => SteeringAvailability::Disabled {
            reason: format!("the MutatingWebhookConfiguration {name} has no webhooks"),
        },
        Ok(None) => SteeringAvailability::Disabled {
            reason: format!(
                "the MutatingWebhookConfiguration {name} does not exist (the chart's \
                 steering.enabled is off, the chart is older, or the API server does not serve \
                 admissionregistration.k8s.io/v1)"
            ),
        },
        Err(e) => SteeringAvailability::Disabled {
            reason: format!(
                "cannot read the MutatingWebhookConfiguration {name} (the controller needs get \
                 on it: see the chart's ClusterRole): {e}"
            ),
        },
    }
}

/// An owner reference to the configuration `name` (cluster-scoped), for what the controller
/// makes at run time that must go when the chart that installed the configuration goes: the
/// garbage collector deletes the dependents once Helm deletes the configuration. None when it
/// cannot be read (the dependent then stays, as it did before).
pub async fn owner(client: &kube::Client, name: &str) -> Option<OwnerReference> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let config = api.get_opt(name).await.ok().flatten()?;
    owner_of(&config)
}

/// The owner reference to `config` (None without a UID, i.e. never stored).
pub fn owner_of(config: &MutatingWebhookConfiguration) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "admissionregistration.k8s.io/v1".to_string(),
        kind: "MutatingWebhookConfiguration".to_string(),
        name: config.metadata.name.clone()?,
        uid: config.metadata.uid.clone()?,
        // Blocking the owner's deletion would need update on its finalizers: not asked for.
        block_owner_deletion: None,
        controller: None,
    })
}

/// The JSON patch that points every webhook of `config` at this replica: `caBundle` set to
/// `ca_pem` (left as it is with `None`: another tool writes it), and with `url` the URL in place
/// of the Service. Each replacement is guarded by a
/// test of the webhook's name, so a configuration changed in between is not patched blindly.
pub fn registration_patch(
    config: &MutatingWebhookConfiguration,
    ca_pem: Option<&str>,
    url: Option<&str>,
) -> json_patch::Patch {
    let mut ops = Vec::new();
    for (i, webhook) in config.webhooks.iter().flatten().enumerate() {
        let mut client_config = webhook.client_config.clone();
        if let Some(ca_pem) = ca_pem {
            client_config.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
        }
        if let Some(url) = url {
            client_config.url = Some(url.to_string());
            client_config.service = None;
        }
        ops.push(
            json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.name}),
        );
        ops.push(
            json!({"op": "replace", "path": format!("/webhooks/{i}/clientConfig"),
                        "value": client_config}),
        );
    }
    // Built from typed values: it always parses.
    serde_json::from_value(serde_json::Value::Array(ops)).unwrap_or_default()
}

/// Whether every webhook of `config` already points at this replica (`caBundle` is `ca_pem`
/// unless that is another tool's; with `url`, that URL in place of a Service).
pub fn points_here(
    config: &MutatingWebhookConfiguration,
    ca_pem: Option<&str>,
    url: Option<&str>,
) -> bool {
    let webhooks = config.webhooks.as_deref().unwrap_or_default();
    !webhooks.is_empty()
        && webhooks.iter().all(|w| {
            let cc = &w.client_config;
            ca_pem.is_none_or(|ca| {
                cc.ca_bundle.as_ref().map(|b| b.0.as_slice()) == Some(ca.as_bytes())
            }) && url.is_none_or(|u| cc.url.as_deref() == Some(u) && cc.service.is_none())
        })
}

/// Points the configuration `name` at this replica (see [`registration_patch`]) unless it
/// already does ([`points_here`]: then nothing is written); returns how many webhooks it
/// holds and whether it had to be written.
pub async fn register(
    client: &kube::Client,
    name: &str,
    ca_pem: Option<&str>,
    url: Option<&str>,
) -> Result<(usize, bool), RegistrationError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let api_error = |source| RegistrationError::Api {
        name: name.to_string(),
        source,
    };
    let config =
        api.get_opt(name)
            .await
            .map_err(api_error)?
            .ok_or_else(|| RegistrationError::Gone {
                name: name.to_string(),
            })?;
    let count = config.webhooks.as_ref().map_or(0, Vec::len);
    if count == 0 {
        return Err(RegistrationError::NoWebhooks {
            name: name.to_string(),
        });
    }
    if points_here(&config, ca_pem, url) {
        return Ok((count, false));
    }
    let patch = registration_patch(&config, ca_pem, url);
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map_err(api_error)?;
    Ok((count, true))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use kube::client::Body;
    use serde_json::Value;

    use super::*;

    fn chart_config() -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "ebb-steering", "resourceVersion": "4"},
            "webhooks": [{
                "name": "steering.ebb.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Ignore", "timeoutSeconds": 2,
                "clientConfig": {"service": {"namespace": "ebb-system", "name": "ebb-steering",
                                             "path": "/steer", "port": 443}}
            }]
        })
    }

    /// An API answering GET with `config` (404 when `None`, `status` when set) and recording
    /// the JSON patches sent, applying them to what later GETs answer.
    fn api(
        config: Option<Value>,
        status: Option<u16>,
        patches: Arc<Mutex<Vec<(String, Value)>>>,
    ) -> kube::Client {
        let state = Arc::new(Mutex::new(config));
        let svc = tower::service_fn(move |req: Request<Body>| {
            let state = state.clone();
            let patches = patches.clone();
            async move {
                let method = req.method().clone();
                let path = req.uri().path().to_string();
                let content_type = req
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let mut current = state.lock().unwrap();
                let (code, out) = match (status, current.as_mut()) {
                    (Some(code), _) => (
                        code,
                        json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "Forbidden", "code": code,
                        "message": "mutatingwebhookconfigurations is forbidden"}),
                    ),
                    (None, None) => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                    (None, Some(obj)) => {
                        if method == Method::PATCH {
                            let ops: Value = serde_json::from_slice(&body).unwrap();
                            patches.lock().unwrap().push((content_type, ops.clone()));
                            let patch: json_patch::Patch = serde_json::from_value(ops).unwrap();
                            json_patch::patch(obj, &patch).unwrap();
                        }
                        assert!(
                            path.ends_with("/mutatingwebhookconfigurations/ebb-steering"),
                            "{path}"
                        );
                        (200, obj.clone())
                    }
                };
                Ok::<_, Infallible>(crate::testkit::api::json_response(code, &out))
            }
        });
        kube::Client::new(svc, "default")
    }

    #[tokio::test]
    async fn a_missing_or_unreadable_configuration_turns_steering_off_with_the_reason() {
        let none = api(None, None, Arc::default());
        match check(&none, "ebb-steering").await {
            SteeringAvailability::Disabled { reason } => {
                assert!(reason.contains("does not exist"), "{reason}");
                assert!(reason.contains("steering.enabled"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let forbidden = api(Some(chart_config()), Some(403), Arc::default());
        match check(&forbidden, "ebb-steering").await {
            SteeringAvailability::Disabled { reason } => {
                assert!(reason.contains("needs get"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let mut empty = chart_config();
        empty["webhooks"] = json!([]);
        assert!(matches!(
            check(&api(Some(empty), None, Arc::default()), "ebb-steering").await,
            SteeringAvailability::Disabled { .. }
        ));
        let there = api(Some(chart_config()), None, Arc::default());
        assert_eq!(
            check(&there, "ebb-steering").await,
            SteeringAvailability::Enabled
        );
    }

    #[tokio::test]
    async fn in_a_cluster_only_the_ca_bundle_changes() {
        let patches = Arc::default();
        let client = api(Some(chart_config()), None, Arc::clone(&patches));
        let n = register(
            &client,
            "ebb-steering",
            Some("-----BEGIN CERTIFICATE-----\nAA==\n"),
            None,
        )
        .await
        .unwrap();
        assert_eq!(n, (1, true));
        let sent = patches.lock().unwrap().clone();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, "application/json-patch+json");
        let ops = &sent[0].1;
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/webhooks/0/name", "value": "steering.ebb.dev"})
        );
        let cc = &ops[1]["value"];
        assert_eq!(ops[1]["path"], "/webhooks/0/clientConfig");
        assert_eq!(cc["service"]["name"], "ebb-steering", "the Service is kept");
        assert_eq!(cc["service"]["path"], "/steer");
        assert!(cc.get("url").is_none());
        // base64 of the PEM, as the API expects []byte
        assert_eq!(
            cc["caBundle"],
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkFBPT0K"
        );
    }

    #[tokio::test]
    async fn out_of_a_cluster_the_url_replaces_the_service() {
        let cc = &registered_with_url(chart_config(), Some("pem")).await;
        assert_eq!(cc["url"], "https://127.0.0.1:9555/steer");
        assert!(
            cc.get("service").is_none(),
            "url and service are exclusive: {cc}"
        );
        assert_eq!(cc["caBundle"], "cGVt");
    }

    #[tokio::test]
    async fn a_ca_bundle_another_tool_writes_is_never_touched() {
        // cert-manager's CA injector owns caBundle: in a cluster nothing is written at all, out
        // of one only the URL.
        let mut chart = chart_config();
        chart["webhooks"][0]["clientConfig"]["caBundle"] = json!("aW5qZWN0ZWQ=");
        let patches = Arc::default();
        let client = api(Some(chart.clone()), None, Arc::clone(&patches));
        assert_eq!(
            register(&client, "ebb-steering", None, None).await.unwrap(),
            (1, false)
        );
        assert!(patches.lock().unwrap().is_empty(), "nothing written");
        let cc = &registered_with_url(chart, None).await;
        assert_eq!(cc["url"], "https://127.0.0.1:9555/steer");
        assert_eq!(cc["caBundle"], "aW5qZWN0ZWQ=", "the injected CA is kept");
    }

    /// The clientConfig registering `config` sends with a URL (out of a cluster) and `ca_pem`.
    async fn registered_with_url(config: Value, ca_pem: Option<&str>) -> Value {
        let patches = Arc::default();
        let client = api(Some(config), None, Arc::clone(&patches));
        register(
            &client,
            "ebb-steering",
            ca_pem,
            Some("https://127.0.0.1:9555/steer"),
        )
        .await
        .unwrap();
        let sent = patches.lock().unwrap().clone();
        sent[0].1[1]["value"].clone()
    }

    #[test]
    fn a_configuration_pointing_here_needs_no_write_and_any_change_is_seen() {
        let mut config: MutatingWebhookConfiguration =
            serde_json::from_value(chart_config()).unwrap();
        assert!(!points_here(&config, Some("pem"), None), "no caBundle yet");
        let patch = registration_patch(&config, Some("pem"), None);
        let mut doc = serde_json::to_value(&config).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        config = serde_json::from_value(doc).unwrap();
        assert!(points_here(&config, Some("pem"), None));
        assert!(
            !points_here(&config, Some("other-ca"), None),
            "another replica's CA"
        );
        assert!(
            !points_here(&config, Some("pem"), Some("https://127.0.0.1:9555/steer")),
            "the Service where a URL is wanted"
        );
    }

    #[tokio::test]
    async fn registering_without_the_configuration_or_permission_fails_clearly() {
        let gone = api(None, None, Arc::default());
        let err = register(&gone, "ebb-steering", Some("pem"), None)
            .await
            .unwrap_err();
        assert!(matches!(err, RegistrationError::Gone { .. }), "{err}");
        let forbidden = api(Some(chart_config()), Some(403), Arc::default());
        let err = register(&forbidden, "ebb-steering", Some("pem"), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("get and patch"), "{err}");
    }
}
