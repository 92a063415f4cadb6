//! The webhook's serving certificate: a leaf for the Service's DNS names and 127.0.0.1, made at
//! start, signed by the replicas' shared CA (`super::ca`) or one of its own; the CA is the
//! webhook's `caBundle`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::ServiceName;

/// The serving certificate could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot make the steering webhook's certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot use the steering webhook's certificate for TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("the steering webhook's CA certificate is not PEM: {0}")]
    Pem(String),
    #[error("the steering webhook's CA key does not sign for its certificate: {0}")]
    Mismatch(rustls::Error),
    #[error(
        "cannot use the steering webhook's certificate file {path} (--steering-cert-dir): {reason}"
    )]
    Files { path: String, reason: String },
}

/// A CA as PEM: what signs the replicas' serving certificates (shared through `super::ca`).
#[derive(Clone, Debug)]
pub struct CaMaterial {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A leaf certificate and its key, and the CA that signed it.
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

/// The host of `--steering-webhook-url`, which the certificate must name too (the API server
/// checks it against the URL's host): `None` when the URL has none or it is 127.0.0.1, which the
/// certificate always names.
pub fn url_host(url: &str) -> Option<String> {
    let uri: hyper::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty() && host != "127.0.0.1").then(|| host.to_string())
}

/// The CA's fields: every CA ebb makes has these, so an issuer rebuilt from them and the CA's
/// key signs leaves that chain to the CA certificate.
fn ca_params() -> Result<CertificateParams, CertError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ebb steering webhook CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(ca_params)
}

/// A new CA (ECDSA P-256), as PEM.
pub fn new_ca() -> Result<CaMaterial, CertError> {
    let key = KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?;
    Ok(CaMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Whether `ca`'s key signs certificates that its certificate verifies.
pub fn check_ca(ca: &CaMaterial) -> Result<(), CertError> {
    const NAME: &str = "ca-check.ebb.invalid";
    ServingCert::signed_by(&[NAME.to_string()], ca)?.verify_as(NAME)
}

impl ServingCert {
    /// A new CA of its own and a leaf for `dns_names` and 127.0.0.1.
    pub fn generate(dns_names: &[String]) -> Result<Self, CertError> {
        Self::signed_by(dns_names, &new_ca()?)
    }

    /// A leaf for `dns_names` and 127.0.0.1 (ECDSA P-256, server authentication), signed by
    /// `ca`.
    pub fn signed_by(dns_names: &[String], ca: &CaMaterial) -> Result<Self, CertError> {
        let issuer = Issuer::new(ca_params()?, KeyPair::from_pem(&ca.key_pem)?);
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
        let ca_der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())
            .map_err(|e| CertError::Pem(e.to_string()))?;
        Ok(Self {
            ca_pem: ca.cert_pem.clone(),
            ca_der,
            leaf: leaf.der().clone(),
            key: PrivatePkcs8KeyDer::from(leaf_key.serialize_der()),
        })
    }

    /// Whether a client trusting the CA accepts the leaf for `name`.
    fn verify_as(&self, name: &str) -> Result<(), CertError> {
        use rustls::client::danger::ServerCertVerifier;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca_der.clone())
            .map_err(CertError::Mismatch)?;
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| CertError::Mismatch(rustls::Error::General(e.to_string())))?;
        let server_name = rustls::pki_types::ServerName::try_from(name.to_string())
            .map_err(|e| CertError::Mismatch(rustls::Error::General(e.to_string())))?;
        verifier
            .verify_server_cert(
                &self.leaf,
                &[],
                &server_name,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .map(drop)
            .map_err(CertError::Mismatch)
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

    /// A TLS handshake in memory between a client trusting `cert`'s CA and calling it `name`,
    /// and the server presenting `cert`.
    fn handshake(cert: &ServingCert, name: &str) -> Result<(), rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.ca_der().clone())?;
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = rustls::pki_types::ServerName::try_from(name.to_string())
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let mut client = rustls::ClientConnection::new(Arc::new(config), server_name)?;
        let mut server = rustls::ServerConnection::new(cert.server_config().unwrap())?;
        for _ in 0..10 {
            let mut buf = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            server.read_tls(&mut &buf[..]).unwrap();
            server.process_new_packets()?;
            let mut buf = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut buf).unwrap();
            }
            client.read_tls(&mut &buf[..]).unwrap();
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        Err(rustls::Error::General(
            "the handshake did not finish".into(),
        ))
    }

    #[test]
    fn a_webhook_url_host_is_named_by_the_certificate() {
        assert_eq!(
            url_host("https://steer.example.com:9443/steer").as_deref(),
            Some("steer.example.com")
        );
        assert_eq!(
            url_host("https://10.1.2.3:9443/steer").as_deref(),
            Some("10.1.2.3")
        );
        assert_eq!(
            url_host("https://[fd00::5]:9443/steer").as_deref(),
            Some("fd00::5")
        );
        assert_eq!(url_host("https://127.0.0.1:9443/steer"), None);
        assert_eq!(url_host("not a url"), None);
        let mut names = vec!["ebb-steering.ebb-system.svc".to_string()];
        let without = ServingCert::generate(&names).unwrap();
        names.push("steer.example.com".into());
        names.push("10.1.2.3".into());
        let with = ServingCert::generate(&names).unwrap();
        for name in ["steer.example.com", "10.1.2.3"] {
            assert!(
                handshake(&without, name).is_err(),
                "{name} is not named without the URL"
            );
            handshake(&with, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        handshake(&with, "ebb-steering.ebb-system.svc").unwrap();
        handshake(&with, "127.0.0.1").unwrap();
    }

    #[test]
    fn replicas_signing_with_one_shared_ca_are_trusted_by_its_bundle() {
        let names = vec!["ebb-steering.ebb-system.svc".to_string()];
        let ca = new_ca().unwrap();
        check_ca(&ca).unwrap();
        let one = ServingCert::signed_by(&names, &ca).unwrap();
        let two = ServingCert::signed_by(&names, &ca).unwrap();
        assert_eq!(one.ca_pem(), two.ca_pem(), "one caBundle for both");
        assert_ne!(one.leaf, two.leaf, "each its own leaf");
        // A client trusting the one bundle accepts either replica.
        handshake(&one, &names[0]).unwrap();
        handshake(&two, &names[0]).unwrap();
        let other = ServingCert::generate(&names).unwrap();
        let mut roots_of_one = ServingCert::signed_by(&names, &ca).unwrap();
        roots_of_one.leaf = other.leaf.clone();
        roots_of_one.key = other.key.clone_key();
        assert!(
            handshake(&roots_of_one, &names[0]).is_err(),
            "a leaf of another CA is not trusted"
        );
        // A key that is not the certificate's is refused.
        let mixed = super::CaMaterial {
            cert_pem: ca.cert_pem.clone(),
            key_pem: new_ca().unwrap().key_pem,
        };
        assert!(check_ca(&mixed).is_err());
    }
}
