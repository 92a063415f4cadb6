//! The webhook's serving certificate: a private CA and a leaf for the Service's DNS names and
//! 127.0.0.1, made at start and kept in memory only; the CA is the webhook's `caBundle`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::ServiceName;

/// The serving certificate could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot make the steering webhook's certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot use the steering webhook's certificate for TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// A leaf certificate and its key, signed by a CA made with it (the CA's key is dropped once
/// the leaf is signed: nothing else can be signed by it).
pub struct ServingCert {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    leaf: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

/// The names the API server may call the webhook by: the Service's DNS names.
pub fn dns_names(service: &ServiceName, namespace: &str) -> Vec<String> {
    let name = &service.name;
    let ns = service.namespace.as_deref().unwrap_or(namespace);
    vec![
        name.clone(),
        format!("{name}.{ns}"),
        format!("{name}.{ns}.svc"),
        format!("{name}.{ns}.svc.cluster.local"),
    ]
}

impl ServingCert {
    /// A new CA and a leaf for `dns_names` and 127.0.0.1 (ECDSA P-256, server authentication).
    pub fn generate(dns_names: &[String]) -> Result<Self, CertError> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "ebb steering webhook CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let mut leaf_params = CertificateParams::new(dns_names.to_vec())?;
        leaf_params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        leaf_params.distinguished_name.push(
            DnType::CommonName,
            dns_names.first().map_or("ebb-steering", String::as_str),
        );
        leaf_params.is_ca = IsCa::ExplicitNoCa;
        leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate()?;
        let leaf = leaf_params.signed_by(&leaf_key, &issuer)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            leaf: leaf.der().clone(),
            key: PrivatePkcs8KeyDer::from(leaf_key.serialize_der()),
        })
    }

    /// The CA certificate (PEM): what the webhook configuration's `caBundle` holds.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate (DER), for clients that trust it.
    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    /// A TLS server configuration presenting the leaf (HTTP/1.1, ring's cryptography).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, CertError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![self.leaf.clone()],
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_names_every_way_the_api_server_may_call_it() {
        let svc: ServiceName = "ebb-system/ebb-steering".parse().unwrap();
        assert_eq!(
            dns_names(&svc, "elsewhere"),
            [
                "ebb-steering",
                "ebb-steering.ebb-system",
                "ebb-steering.ebb-system.svc",
                "ebb-steering.ebb-system.svc.cluster.local"
            ]
        );
        let bare: ServiceName = "steer".parse().unwrap();
        assert_eq!(dns_names(&bare, "ops")[2], "steer.ops.svc");
    }

    #[test]
    fn two_starts_make_two_different_cas() {
        let names = vec!["a.b.svc".to_string()];
        let one = ServingCert::generate(&names).unwrap();
        let two = ServingCert::generate(&names).unwrap();
        assert!(one.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(one.ca_pem(), two.ca_pem());
        assert_ne!(one.leaf, one.ca_der, "the leaf is not the CA");
        one.server_config().unwrap();
    }
}
