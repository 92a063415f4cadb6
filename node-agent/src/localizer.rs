//! Fetches a role's `localResources` into the node cache: `http(s)://` or `file://`, streamed to a
//! temp file with a size limit, fsynced, SHA-256 verified, then atomically renamed into place.
//! Transient failures are retried with exponential backoff; concurrent fetches are bounded.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::store::{CacheScope, LocalizedRecord, UnixMillis};
use crate::tokens::hex;

/// One resource to fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchRequest {
    pub scope: CacheScope,
    /// Path relative to the cache root (see `local_path`).
    pub local_path: String,
    pub name: String,
    pub url: String,
    pub sha256: String,
    /// Largest accepted size in bytes (the smaller of the resource's and the agent's limit).
    pub max_bytes: u64,
}

/// Where a resource lives in the cache: `public/<sha256>/<name>`,
/// `namespace/<ns>/<sha256>/<name>` or `application/<ns>/<history>/<sha256>/<name>`.
pub fn local_path(scope: &CacheScope, sha256: &str, name: &str) -> String {
    match scope {
        CacheScope::Public => format!("public/{sha256}/{name}"),
        CacheScope::Namespace { namespace } => format!("namespace/{namespace}/{sha256}/{name}"),
        CacheScope::Application {
            namespace,
            placement_history,
        } => format!("application/{namespace}/{placement_history}/{sha256}/{name}"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: content has SHA-256 {actual}, expected {expected}; the file was deleted")]
    DigestMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{url}: larger than the limit of {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}: unsupported URL scheme (use http://, https:// or file://)")]
    UnsupportedScheme { url: String },
    #[error("{url}: HTTP status {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {message}")]
    Transfer { url: String, message: String },
    #[error("cache file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl FetchError {
    /// Worth another attempt: network trouble and server-side errors (5xx, 429).
    pub fn is_transient(&self) -> bool {
        match self {
            FetchError::Transfer { .. } => true,
            FetchError::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct FetcherConfig {
    pub cache_root: PathBuf,
    pub concurrency: usize,
    pub attempts: u32,
    pub backoff_base: Duration,
    pub timeout: Duration,
}

impl FetcherConfig {
    pub fn new(cache_root: PathBuf) -> Self {
        Self {
            cache_root,
            concurrency: 4,
            attempts: 4,
            backoff_base: Duration::from_millis(500),
            timeout: Duration::from_secs(600),
        }
    }
}

/// Shared fetcher: one HTTP client, a bound on concurrent fetches.
#[derive(Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    cfg: Arc<FetcherConfig>,
    permits: Arc<Semaphore>,
    temp_seq: Arc<AtomicU64>,
}

impl Fetcher {
    pub fn new(cfg: FetcherConfig) -> Result<Fetcher, FetchError> {
        // reqwest is built without a bundled crypto provider; use ring, as kube does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| FetchError::Transfer {
                url: String::new(),
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(Fetcher {
            client,
            permits: Arc::new(Semaphore::new(cfg.concurrency.max(1))),
            cfg: Arc::new(cfg),
            temp_seq: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn cache_root(&self) -> &Path {
        &self.cfg.cache_root
    }

    /// Fetches with retries; at most `concurrency` fetches run at once.
    pub async fn fetch(
        &self,
        req: &FetchRequest,
        now: impl Fn() -> UnixMillis,
    ) -> Result<LocalizedRecord, FetchError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| FetchError::Transfer {
                url: req.url.clone(),
                message: "the fetcher is shutting down".into(),
            })?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.fetch_once(req).await {
                Ok(size) => {
                    return Ok(LocalizedRecord {
                        name: req.name.clone(),
                        url: req.url.clone(),
                        sha256: req.sha256.clone(),
                        size_bytes: size,
                        completed_at: now(),
                    });
                }
                Err(e) if e.is_transient() && attempt < self.cfg.attempts => {
                    let delay = self.cfg.backoff_base * 2u32.saturating_pow(attempt - 1);
                    tracing::warn!(url = %req.url, attempt, error = %e, delay_ms = delay.as_millis() as u64, "fetch failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn fetch_once(&self, req: &FetchRequest) -> Result<u64, FetchError> {
        let target = self.cfg.cache_root.join(&req.local_path);
        let parent = target
            .parent()
            .unwrap_or(&self.cfg.cache_root)
            .to_path_buf();
        tokio::fs::create_dir_all(&parent)
            .await
            .map_err(|source| FetchError::Io {
                path: parent.clone(),
                source,
            })?;
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = target
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        tmp_name.push(format!(".part-{}-{seq}", std::process::id()));
        let tmp = parent.join(tmp_name);
        let result = self.download_to(req, &tmp).await;
        let (size, digest) = match result {
            Ok(v) => v,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        if !digest.eq_ignore_ascii_case(&req.sha256) {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(FetchError::DigestMismatch {
                url: req.url.clone(),
                expected: req.sha256.clone(),
                actual: digest,
            });
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| FetchError::Io { path, source }
        };
        tokio::fs::rename(&tmp, &target)
            .await
            .map_err(io(&target))?;
        // make the rename durable
        let dir = tokio::fs::File::open(&parent).await.map_err(io(&parent))?;
        dir.sync_all().await.map_err(io(&parent))?;
        Ok(size)
    }

    /// Streams the source into `tmp`, returning size and hex SHA-256. The file is fsynced.
    async fn download_to(
        &self,
        req: &FetchRequest,
        tmp: &Path,
    ) -> Result<(u64, String), FetchError> {
        let io = |source| FetchError::Io {
            path: tmp.to_path_buf(),
            source,
        };
        let mut file = tokio::fs::File::create(tmp).await.map_err(io)?;
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let too_large = || FetchError::TooLarge {
            url: req.url.clone(),
            limit: req.max_bytes,
        };
        if let Some(path) = req.url.strip_prefix("file://") {
            let mut src = tokio::fs::File::open(path)
                .await
                .map_err(|e| FetchError::Io {
                    path: PathBuf::from(path),
                    source: e,
                })?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = src.read(&mut buf).await.map_err(|e| FetchError::Io {
                    path: PathBuf::from(path),
                    source: e,
                })?;
                if n == 0 {
                    break;
                }
                size += n as u64;
                if size > req.max_bytes {
                    return Err(too_large());
                }
                hasher.update(&buf[..n]);
                file.write_all(&buf[..n]).await.map_err(io)?;
            }
        } else if req.url.starts_with("http://") || req.url.starts_with("https://") {
            let transfer = |e: reqwest::Error| FetchError::Transfer {
                url: req.url.clone(),
                message: e.to_string(),
            };
            let resp = self.client.get(&req.url).send().await.map_err(transfer)?;
            if !resp.status().is_success() {
                return Err(FetchError::Status {
                    url: req.url.clone(),
                    status: resp.status().as_u16(),
                });
            }
            if resp.content_length().is_some_and(|l| l > req.max_bytes) {
                return Err(too_large());
            }
            let mut body = resp.bytes_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(transfer)?;
                size += chunk.len() as u64;
                if size > req.max_bytes {
                    return Err(too_large());
                }
                hasher.update(&chunk);
                file.write_all(&chunk).await.map_err(io)?;
            }
        } else {
            return Err(FetchError::UnsupportedScheme {
                url: req.url.clone(),
            });
        }
        file.flush().await.map_err(io)?;
        file.sync_all().await.map_err(io)?;
        Ok((size, hex(&hasher.finalize())))
    }
}

/// Hex SHA-256 of bytes (tests and tools).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicUsize;

    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::get;

    use super::*;

    const CONTENT: &[u8] = b"model weights, version 7\n";

    async fn serve() -> (SocketAddr, Arc<AtomicUsize>) {
        let flaky_calls = Arc::new(AtomicUsize::new(0));
        let calls = flaky_calls.clone();
        let app = Router::new()
            .route("/model.bin", get(|| async { CONTENT }))
            .route("/big.bin", get(|| async { vec![7u8; 100_000] }))
            .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
            .route(
                "/flaky.bin",
                get(move || {
                    let calls = calls.clone();
                    async move {
                        if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                            Err(StatusCode::SERVICE_UNAVAILABLE)
                        } else {
                            Ok(CONTENT)
                        }
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (addr, flaky_calls)
    }

    fn fetcher(root: &Path) -> Fetcher {
        let mut cfg = FetcherConfig::new(root.to_path_buf());
        cfg.backoff_base = Duration::from_millis(5);
        cfg.timeout = Duration::from_secs(10);
        Fetcher::new(cfg).unwrap()
    }

    fn request(url: String, sha: &str) -> FetchRequest {
        let scope = CacheScope::Public;
        FetchRequest {
            local_path: local_path(&scope, sha, "model.bin"),
            scope,
            name: "model".into(),
            url,
            sha256: sha.into(),
            max_bytes: 1 << 20,
        }
    }

    fn files_under(root: &Path) -> Vec<String> {
        let mut out = vec![];
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push(p.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        out.sort();
        out
    }

    #[tokio::test]
    async fn fetches_over_http_verifies_and_renames_into_place() {
        let (addr, _) = serve().await;
        let dir = tempfile::tempdir().unwrap();
        let f = fetcher(dir.path());
        let sha = sha256_hex(CONTENT);
        let req = request(format!("http://{addr}/model.bin"), &sha);
        let rec = f.fetch(&req, || 42).await.unwrap();
        assert_eq!(rec.size_bytes, CONTENT.len() as u64);
        assert_eq!(rec.completed_at, 42);
        assert_eq!(
            std::fs::read(dir.path().join(&req.local_path)).unwrap(),
            CONTENT
        );
        assert_eq!(
            files_under(dir.path()),
            vec![req.local_path.clone()],
            "no temp file left"
        );
    }

    #[tokio::test]
    async fn digest_mismatch_leaves_nothing_behind() {
        let (addr, _) = serve().await;
        let dir = tempfile::tempdir().unwrap();
        let wrong = sha256_hex(b"something else");
        let req = request(format!("http://{addr}/model.bin"), &wrong);
        let err = fetcher(dir.path()).fetch(&req, || 0).await.unwrap_err();
        assert!(
            matches!(err, FetchError::DigestMismatch { ref actual, .. } if *actual == sha256_hex(CONTENT)),
            "{err}"
        );
        assert!(files_under(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn size_limit_status_and_scheme_errors_are_not_retried() {
        let (addr, _) = serve().await;
        let dir = tempfile::tempdir().unwrap();
        let f = fetcher(dir.path());
        let mut big = request(
            format!("http://{addr}/big.bin"),
            &sha256_hex(&[7u8; 100_000]),
        );
        big.max_bytes = 1_000;
        assert!(matches!(
            f.fetch(&big, || 0).await,
            Err(FetchError::TooLarge { limit: 1_000, .. })
        ));
        let missing = request(format!("http://{addr}/missing"), &sha256_hex(b""));
        assert!(matches!(
            f.fetch(&missing, || 0).await,
            Err(FetchError::Status { status: 404, .. })
        ));
        let ftp = request("ftp://example.com/x".into(), &sha256_hex(b""));
        assert!(matches!(
            f.fetch(&ftp, || 0).await,
            Err(FetchError::UnsupportedScheme { .. })
        ));
        assert!(files_under(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn transient_failures_are_retried_with_backoff() {
        let (addr, calls) = serve().await;
        let dir = tempfile::tempdir().unwrap();
        let req = request(format!("http://{addr}/flaky.bin"), &sha256_hex(CONTENT));
        let rec = fetcher(dir.path()).fetch(&req, || 0).await.unwrap();
        assert_eq!(rec.size_bytes, CONTENT.len() as u64);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn concurrent_fetches_are_bounded() {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (f, p) = (in_flight.clone(), peak.clone());
        let app = Router::new().route(
            "/slow/{n}",
            get(move || {
                let (f, p) = (f.clone(), p.clone());
                async move {
                    let now = f.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    f.fetch_sub(1, Ordering::SeqCst);
                    CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FetcherConfig::new(dir.path().to_path_buf());
        cfg.concurrency = 2;
        let fetcher = Fetcher::new(cfg).unwrap();
        let sha = sha256_hex(CONTENT);
        let tasks: Vec<_> = (0..6)
            .map(|n| {
                let fetcher = fetcher.clone();
                let mut req = request(format!("http://{addr}/slow/{n}"), &sha);
                req.local_path = format!("public/{sha}/model-{n}.bin");
                tokio::spawn(async move { fetcher.fetch(&req, || 0).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(
            peak.load(Ordering::SeqCst),
            2,
            "never more than the bound, and it is used"
        );
        assert_eq!(files_under(dir.path()).len(), 6);
    }

    #[tokio::test]
    async fn fetches_file_urls() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.bin");
        std::fs::write(&src, CONTENT).unwrap();
        let root = dir.path().join("cache");
        let req = request(format!("file://{}", src.display()), &sha256_hex(CONTENT));
        fetcher(&root).fetch(&req, || 0).await.unwrap();
        assert_eq!(std::fs::read(root.join(&req.local_path)).unwrap(), CONTENT);
    }
}
