//! The steering webhook's CA, shared by every replica through one Secret in the controller's
//! namespace: each signs its own serving certificate with it, so the API server trusts whichever
//! replica the configuration and the Service reach, and a new leader writes the same `caBundle`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};

/// Keys of the Secret: the CA certificate and its private key (PEM).
pub const CERT_KEY: &str = "ca.crt";
pub const PRIVATE_KEY: &str = "ca.key";

pub use super::cert::CaMaterial;

/// The shared CA could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error(
        "cannot read or create the Secret {namespace}/{name} holding the steering webhook's CA (the controller needs get on it and create on Secrets in its namespace: see the chart's Role): {source}"
    )]
    Api {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "the Secret {namespace}/{name} does not hold a steering webhook CA ({why}); delete it and the controller makes a new one"
    )]
    Unusable {
        namespace: String,
        name: String,
        why: String,
    },
    #[error(transparent)]
    Cert(#[from] super::cert::CertError),
}

/// The CA in Secret `namespace/name`: read, or made and created when there is none (a replica
/// that loses the race to create it reads the winner's). A Secret made here is owned by `owner`
/// (the webhook configuration): uninstalling the chart deletes the CA's private key with it.
pub async fn shared(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    owner: Option<OwnerReference>,
) -> Result<CaMaterial, CaError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let api_error = |source| CaError::Api {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    };
    if let Some(s) = api.get_opt(name).await.map_err(api_error)? {
        return read(&s, namespace, name);
    }
    let made = super::cert::new_ca()?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "ebb-controller".to_string(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                CERT_KEY.to_string(),
                ByteString(made.cert_pem.clone().into_bytes()),
            ),
            (
                PRIVATE_KEY.to_string(),
                ByteString(made.key_pem.clone().into_bytes()),
            ),
        ])),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %format!("{namespace}/{name}"), "made the steering webhook's CA");
            Ok(made)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let s = api.get(name).await.map_err(api_error)?;
            read(&s, namespace, name)
        }
        Err(e) => Err(api_error(e)),
    }
}

/// The CA held by `secret`, checked usable.
fn read(secret: &Secret, namespace: &str, name: &str) -> Result<CaMaterial, CaError> {
    let unusable = |why: String| CaError::Unusable {
        namespace: namespace.to_string(),
        name: name.to_string(),
        why,
    };
    let field = |key: &str| -> Result<String, CaError> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| unusable(format!("no key {key}")))?;
        String::from_utf8(bytes.0.clone()).map_err(|_| unusable(format!("{key} is not PEM")))
    };
    let ca = CaMaterial {
        cert_pem: field(CERT_KEY)?,
        key_pem: field(PRIVATE_KEY)?,
    };
    super::cert::check_ca(&ca).map_err(|e| unusable(e.to_string()))?;
    Ok(ca)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_secret_holding_a_ca_is_read_back_and_others_are_refused_by_name() {
        let made = super::super::cert::new_ca().unwrap();
        let s = secret(&[(CERT_KEY, &made.cert_pem), (PRIVATE_KEY, &made.key_pem)]);
        let back = read(&s, "ebb", "ebb-steering-ca").unwrap();
        assert_eq!(back.cert_pem, made.cert_pem);
        let no_key = read(&secret(&[(CERT_KEY, &made.cert_pem)]), "ebb", "x").unwrap_err();
        assert!(no_key.to_string().contains("no key ca.key"), "{no_key}");
        let other = super::super::cert::new_ca().unwrap();
        let mixed = secret(&[(CERT_KEY, &made.cert_pem), (PRIVATE_KEY, &other.key_pem)]);
        let e = read(&mixed, "ebb", "x").unwrap_err();
        assert!(e.to_string().contains("ebb/x"), "{e}");
    }
}
