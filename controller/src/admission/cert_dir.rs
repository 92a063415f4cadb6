//! The webhook's serving certificate from files another tool keeps (cert-manager's Secret
//! mounted as `tls.crt` and `tls.key`), served as it is now and re-read when the files change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::cert::CertError;

/// The certificate chain's file in the directory (cert-manager's Secret key).
pub const CERT_FILE: &str = "tls.crt";
/// The private key's file in the directory.
pub const KEY_FILE: &str = "tls.key";
/// How often the files are looked at for a renewed certificate.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The certificate in a directory, kept current by [`CertDir::watch`].
#[derive(Debug)]
pub struct CertDir {
    dir: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' bytes last loaded: a change is a new certificate.
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl CertDir {
    /// Loads `dir/tls.crt` and `dir/tls.key`; fails naming the file and what is wrong.
    pub fn load(dir: &Path) -> Result<Arc<Self>, CertError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert, key) = read(dir)?;
        let current = certified(dir, &cert, &key, &provider)?;
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(current)),
            loaded: Mutex::new((cert, key)),
        }))
    }

    /// Reads the files again: `Ok(true)` when they changed and the new certificate is served
    /// from now on; an unusable new pair is an error and the one served stays.
    pub fn reload(&self) -> Result<bool, CertError> {
        let (cert, key) = read(&self.dir)?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.0 == cert && loaded.1 == key {
            return Ok(false);
        }
        let next = certified(&self.dir, &cert, &key, &self.provider)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        *loaded = (cert, key);
        Ok(true)
    }

    /// The certificate served now: its chain (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .cert
            .clone()
    }

    /// A TLS server configuration that presents the current certificate (HTTP/1.1, ring).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, CertError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Re-reads the files every `every` until `stop`; a renewal is logged, and so is a pair
    /// that cannot be used (the previous certificate is served meanwhile).
    pub async fn watch(self: Arc<Self>, every: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            match self.reload() {
                Ok(true) => {
                    tracing::info!(dir = %self.dir.display(), "steering webhook certificate renewed from its files")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the steering webhook keeps serving its previous certificate")
                }
            }
        }
    }
}

impl ResolvesServerCert for CertDir {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

fn read(dir: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let file = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|e| CertError::Files {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    };
    Ok((file(CERT_FILE)?, file(KEY_FILE)?))
}

fn certified(
    dir: &Path,
    cert: &[u8],
    key: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, CertError> {
    let bad = |name: &str, reason: String| CertError::Files {
        path: dir.join(name).display().to_string(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(CERT_FILE, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(bad(CERT_FILE, "holds no certificate".to_string()));
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| bad(KEY_FILE, format!("not a PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, key, provider)
        .map_err(|e| bad(KEY_FILE, format!("does not go with {CERT_FILE}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn pair(name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn write(dir: &Path, (cert, key): &(String, String)) {
        std::fs::write(dir.join(CERT_FILE), cert).unwrap();
        std::fs::write(dir.join(KEY_FILE), key).unwrap();
    }

    fn leaf_pem(c: &CertDir) -> Vec<u8> {
        c.chain()[0].as_ref().to_vec()
    }

    #[test]
    fn a_renewed_pair_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let first = pair("ebb-steering.ebb-system.svc");
        write(dir.path(), &first);
        let c = CertDir::load(dir.path()).unwrap();
        let served = leaf_pem(&c);
        assert!(!c.reload().unwrap(), "unchanged files: nothing new");

        let second = pair("ebb-steering.ebb-system.svc");
        write(dir.path(), &second);
        assert!(c.reload().unwrap(), "renewed");
        assert_ne!(leaf_pem(&c), served, "the new leaf is served");
        let renewed = leaf_pem(&c);

        // A key that is not the certificate's: refused, the renewed pair stays.
        let third = pair("x");
        std::fs::write(dir.path().join(KEY_FILE), &third.1).unwrap();
        let err = c.reload().unwrap_err().to_string();
        assert!(err.contains(KEY_FILE), "{err}");
        assert_eq!(leaf_pem(&c), renewed);
        assert!(c.server_config().is_ok());
    }

    #[test]
    fn missing_or_garbled_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = CertDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains(CERT_FILE), "{err}");
        std::fs::write(dir.path().join(CERT_FILE), "not pem").unwrap();
        std::fs::write(dir.path().join(KEY_FILE), "not pem").unwrap();
        let err = CertDir::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("tls.crt") && err.contains("no certificate"),
            "{err}"
        );
    }
}
