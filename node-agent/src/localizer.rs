//! Fetches a role's `localResources` into the node cache: `http(s)://` under the address policy or
//! `file://` under the operator's roots (`fetch_policy`), streamed into a new temp file with a size
//! limit, SHA-256 verified, then renamed into place without following links (`cache_fs`).
//! Transient failures are retried with exponential backoff, without holding a fetch slot meanwhile.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::cache_fs::{self, CacheFsError};
use crate::fetch_policy::{FetchPolicy, Lookup, OpenError, Refusal, SystemLookup};
use crate::redact::redact;
use crate::store::{CacheScope, LocalizedRecord, UnixMillis};
use crate::tokens::hex;

/// One resource to fetch.
#[derive(Clone, PartialEq, Eq)]
pub struct FetchRequest {
    pub scope: CacheScope,
    /// Path relative to the cache root (see `local_path`).
    pub local_path: String,
    pub name: String,
    /// The URL as written in the PlacementHistory (may carry credentials: show `shown_url`).
    pub url: String,
    pub sha256: String,
    /// Largest accepted size in bytes (the smaller of the resource's and the agent's limit).
    pub max_bytes: u64,
    /// Namespace of the pod that asked for it (charged for it in the cache quota).
    pub namespace: String,
}

/// Shows the URL redacted, so a request in a debug log leaks no credentials.
impl std::fmt::Debug for FetchRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchRequest")
            .field("scope", &self.scope)
            .field("local_path", &self.local_path)
            .field("name", &self.name)
            .field("url", &self.shown_url())
            .field("sha256", &self.sha256)
            .field("max_bytes", &self.max_bytes)
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl FetchRequest {
    /// The URL without credentials, query or fragment: the only form logged or reported.
    pub fn shown_url(&self) -> String {
        redact(&self.url)
    }
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

/// Why a fetch failed. `url` is always redacted; no variant carries what the source held (a
/// digest of it, for instance), only that it did not match.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: digest mismatch (the content is not what sha256 names); it was discarded")]
    DigestMismatch { url: String },
    #[error("{url}: larger than the limit of {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}: unsupported URL (use http://, https:// or file:///<path>)")]
    UnsupportedScheme { url: String },
    #[error("{url}: refused: {reason}")]
    Refused { url: String, reason: Refusal },
    #[error("{url}: HTTP status {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {message}")]
    Transfer { url: String, message: String },
    #[error("{url}: {message}")]
    Source { url: String, message: String },
    #[error("{0}")]
    Cache(#[from] CacheFsError),
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

/// A reqwest error as a sentence without the URL (which may carry credentials), or the policy's
/// refusal found in its causes.
fn describe(e: &reqwest::Error) -> Result<String, Refusal> {
    use std::error::Error as _;
    let mut message = String::from(if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_redirect() {
        "redirect failed"
    } else if e.is_body() || e.is_decode() {
        "reading the response failed"
    } else {
        "request failed"
    });
    let mut cause = e.source();
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<Refusal>() {
            return Err(r.clone());
        }
        let text = c.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    Ok(message)
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

/// Shared fetcher: one HTTP client, the source policy, a bound on concurrent transfers.
#[derive(Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    policy: Arc<FetchPolicy>,
    cfg: Arc<FetcherConfig>,
    permits: Arc<Semaphore>,
    temp_seq: Arc<AtomicU64>,
}

enum Opened {
    File(tokio::fs::File),
    Http(reqwest::Response),
}

impl Fetcher {
    pub fn new(cfg: FetcherConfig, policy: Arc<FetchPolicy>) -> Result<Fetcher, FetchError> {
        Self::with_lookup(cfg, policy, Arc::new(SystemLookup))
    }

    /// A fetcher resolving names with `lookup` (tests script DNS answers with it).
    pub fn with_lookup(
        cfg: FetcherConfig,
        policy: Arc<FetchPolicy>,
        lookup: Arc<dyn Lookup>,
    ) -> Result<Fetcher, FetchError> {
        let client = crate::fetch_policy::http_client(policy.clone(), lookup, cfg.timeout)
            .map_err(|e| FetchError::Transfer {
                url: String::new(),
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(Fetcher {
            client,
            policy,
            permits: Arc::new(Semaphore::new(cfg.concurrency.max(1))),
            cfg: Arc::new(cfg),
            temp_seq: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn cache_root(&self) -> &Path {
        &self.cfg.cache_root
    }

    pub fn policy(&self) -> &Arc<FetchPolicy> {
        &self.policy
    }

    /// Fetches with retries; at most `concurrency` attempts run at once, and a fetch waiting to
    /// retry holds no slot.
    pub async fn fetch(
        &self,
        req: &FetchRequest,
        now: impl Fn() -> UnixMillis,
    ) -> Result<LocalizedRecord, FetchError> {
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| FetchError::Transfer {
                    url: req.shown_url(),
                    message: "the fetcher is shutting down".into(),
                })?;
            let result = self.fetch_once(req).await;
            drop(permit);
            match result {
                Ok(size) => {
                    return Ok(LocalizedRecord {
                        name: req.name.clone(),
                        url: req.shown_url(),
                        sha256: req.sha256.clone(),
                        size_bytes: size,
                        completed_at: now(),
                    });
                }
                Err(e) if e.is_transient() && attempt < self.cfg.attempts => {
                    let delay = self
                        .cfg
                        .backoff_base
                        .saturating_mul(2u32.saturating_pow(attempt - 1));
                    tracing::warn!(url = %req.shown_url(), attempt, error = %e, delay_ms = delay.as_millis() as u64, "fetch failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens the source; a refused one is refused before anything is read or connected to.
    async fn open_source(&self, req: &FetchRequest) -> Result<Opened, FetchError> {
        let shown = req.shown_url();
        let unsupported = || FetchError::UnsupportedScheme { url: shown.clone() };
        let url = url::Url::parse(&req.url).map_err(|_| unsupported())?;
        let refused = |reason| FetchError::Refused {
            url: shown.clone(),
            reason,
        };
        match url.scheme() {
            "file" => {
                let policy = self.policy.clone();
                let file = tokio::task::spawn_blocking(move || policy.open_file(&url))
                    .await
                    .map_err(|e| FetchError::Source {
                        url: shown.clone(),
                        message: format!("reading the file failed: {e}"),
                    })?
                    .map_err(|e| match e {
                        OpenError::Refused(r) => refused(r),
                        OpenError::Io(io) => FetchError::Source {
                            url: shown.clone(),
                            message: format!("cannot read it: {io}"),
                        },
                    })?;
                Ok(Opened::File(tokio::fs::File::from_std(file)))
            }
            "http" | "https" => {
                self.policy.check_url(&url).map_err(refused)?;
                let resp = match self.client.get(url).send().await {
                    Ok(r) => r,
                    Err(e) => {
                        return Err(match describe(&e) {
                            Err(reason) => refused(reason),
                            Ok(message) => FetchError::Transfer {
                                url: shown.clone(),
                                message,
                            },
                        });
                    }
                };
                if !resp.status().is_success() {
                    return Err(FetchError::Status {
                        url: shown.clone(),
                        status: resp.status().as_u16(),
                    });
                }
                if resp.content_length().is_some_and(|l| l > req.max_bytes) {
                    return Err(FetchError::TooLarge {
                        url: shown,
                        limit: req.max_bytes,
                    });
                }
                Ok(Opened::Http(resp))
            }
            _ => Err(unsupported()),
        }
    }

    async fn fetch_once(&self, req: &FetchRequest) -> Result<u64, FetchError> {
        let layout = cache_fs::layout(&req.scope, &req.sha256, &req.name)?;
        let source = self.open_source(req).await?;
        let dir = cache_fs::open_dirs(&self.cfg.cache_root, &layout)?;
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = format!(".{}.part-{}-{seq}", layout.file, std::process::id());
        let file = dir.create_new(&tmp)?;
        let mut file = tokio::fs::File::from_std(file);
        let written = self.copy(req, source, &mut file, dir.path()).await;
        let size = match written {
            Ok((size, digest)) if digest.eq_ignore_ascii_case(&req.sha256) => size,
            Ok(_) => {
                dir.remove(&tmp);
                return Err(FetchError::DigestMismatch {
                    url: req.shown_url(),
                });
            }
            Err(e) => {
                dir.remove(&tmp);
                return Err(e);
            }
        };
        let file = file.into_std().await;
        if let Err(e) = dir.finish(&file, &tmp, &layout.file, layout.file_mode) {
            dir.remove(&tmp);
            return Err(e.into());
        }
        Ok(size)
    }

    /// Streams the source into `file`, returning size and hex SHA-256. The file is fsynced.
    async fn copy(
        &self,
        req: &FetchRequest,
        source: Opened,
        file: &mut tokio::fs::File,
        dir: &Path,
    ) -> Result<(u64, String), FetchError> {
        let io = |source: std::io::Error| {
            FetchError::Cache(CacheFsError::Io {
                path: dir.to_path_buf(),
                source,
            })
        };
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let too_large = || FetchError::TooLarge {
            url: req.shown_url(),
            limit: req.max_bytes,
        };
        match source {
            Opened::File(mut src) => {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = src.read(&mut buf).await.map_err(|e| FetchError::Source {
                        url: req.shown_url(),
                        message: format!("cannot read it: {e}"),
                    })?;
                    if n == 0 {
                        break;
                    }
                    size = size.saturating_add(n as u64);
                    if size > req.max_bytes {
                        return Err(too_large());
                    }
                    hasher.update(&buf[..n]);
                    file.write_all(&buf[..n]).await.map_err(io)?;
                }
            }
            Opened::Http(resp) => {
                let mut body = resp.bytes_stream();
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.map_err(|e| match describe(&e) {
                        Err(reason) => FetchError::Refused {
                            url: req.shown_url(),
                            reason,
                        },
                        Ok(message) => FetchError::Transfer {
                            url: req.shown_url(),
                            message,
                        },
                    })?;
                    size = size.saturating_add(chunk.len() as u64);
                    if size > req.max_bytes {
                        return Err(too_large());
                    }
                    hasher.update(&chunk);
                    file.write_all(&chunk).await.map_err(io)?;
                }
            }
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
    use crate::fetch_policy::{PolicyConfig, parse_cidr};

    const CONTENT: &[u8] = b"model weights, version 7\n";

    /// Serves `app` on a loopback port of its own.
    async fn listen(app: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

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
        let addr = listen(app).await;
        (addr, flaky_calls)
    }

    /// The test servers listen on 127.0.0.1, which an operator has to allow.
    fn loopback_allowed() -> Arc<FetchPolicy> {
        Arc::new(
            FetchPolicy::new(PolicyConfig {
                allow_cidrs: vec![parse_cidr("127.0.0.1").unwrap()],
                ..PolicyConfig::default()
            })
            .unwrap(),
        )
    }

    fn fetcher_with(root: &Path, policy: Arc<FetchPolicy>) -> Fetcher {
        cache_fs::prepare_root(root, false).unwrap();
        let mut cfg = FetcherConfig::new(root.to_path_buf());
        cfg.backoff_base = Duration::from_millis(5);
        cfg.timeout = Duration::from_secs(10);
        Fetcher::new(cfg, policy).unwrap()
    }

    fn fetcher(root: &Path) -> Fetcher {
        fetcher_with(root, loopback_allowed())
    }

    fn request(url: String, sha: &str) -> FetchRequest {
        let scope = CacheScope::Public;
        FetchRequest {
            local_path: local_path(&scope, sha, "model.bin"),
            scope,
            name: "model.bin".into(),
            url,
            sha256: sha.into(),
            max_bytes: 1 << 20,
            namespace: "ns".into(),
        }
    }

    fn files_under(root: &Path) -> Vec<String> {
        let mut out = vec![];
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p != root.join(cache_fs::MARKER) {
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
    async fn digest_mismatch_leaves_nothing_behind_and_names_no_digest() {
        let (addr, _) = serve().await;
        let dir = tempfile::tempdir().unwrap();
        let wrong = sha256_hex(b"something else");
        let req = request(format!("http://{addr}/model.bin"), &wrong);
        let err = fetcher(dir.path()).fetch(&req, || 0).await.unwrap_err();
        assert!(matches!(err, FetchError::DigestMismatch { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("digest mismatch"), "{text}");
        assert!(
            !text.contains(&sha256_hex(CONTENT)),
            "the content's digest is revealed: {text}"
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
    async fn a_fetch_waiting_to_retry_holds_no_slot() {
        // Always 503: the fetch retries with long waits; with one slot, another fetch still runs.
        let app = Router::new()
            .route("/down", get(|| async { StatusCode::SERVICE_UNAVAILABLE }))
            .route("/up", get(|| async { CONTENT }));
        let addr = listen(app).await;
        let dir = tempfile::tempdir().unwrap();
        cache_fs::prepare_root(dir.path(), false).unwrap();
        let mut cfg = FetcherConfig::new(dir.path().to_path_buf());
        cfg.concurrency = 1;
        cfg.backoff_base = Duration::from_secs(30);
        let f = Fetcher::new(cfg, loopback_allowed()).unwrap();
        let down = request(format!("http://{addr}/down"), &sha256_hex(CONTENT));
        let f2 = f.clone();
        let stuck = tokio::spawn(async move { f2.fetch(&down, || 0).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut up = request(format!("http://{addr}/up"), &sha256_hex(CONTENT));
        up.local_path = format!("public/{}/up", up.sha256);
        up.name = "up".into();
        let done = tokio::time::timeout(Duration::from_secs(5), f.fetch(&up, || 0)).await;
        assert!(
            matches!(done, Ok(Ok(_))),
            "the second fetch waited for the first one's retries: {done:?}"
        );
        stuck.abort();
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
        let addr = listen(app).await;
        let dir = tempfile::tempdir().unwrap();
        cache_fs::prepare_root(dir.path(), false).unwrap();
        let mut cfg = FetcherConfig::new(dir.path().to_path_buf());
        cfg.concurrency = 2;
        let fetcher = Fetcher::new(cfg, loopback_allowed()).unwrap();
        let sha = sha256_hex(CONTENT);
        let tasks: Vec<_> = (0..6)
            .map(|n| {
                let fetcher = fetcher.clone();
                let mut req = request(format!("http://{addr}/slow/{n}"), &sha);
                req.name = format!("model-{n}.bin");
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
    async fn refused_sources_are_never_contacted_and_touch_nothing() {
        let (addr, _) = serve().await;
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let app = Router::new().fallback(move || {
            h.fetch_add(1, Ordering::SeqCst);
            async { CONTENT }
        });
        let port = listen(app).await.port();
        let dir = tempfile::tempdir().unwrap();
        // The default policy: loopback is not allowed.
        let f = fetcher_with(
            dir.path(),
            Arc::new(FetchPolicy::new(PolicyConfig::default()).unwrap()),
        );
        let sha = sha256_hex(CONTENT);
        for url in [
            format!("http://127.0.0.1:{port}/a"),
            format!("http://localhost:{port}/b"),
            format!("http://[::ffff:127.0.0.1]:{port}/c"),
            format!("http://2130706433:{port}/d"),
            format!("http://0x7f.1:{port}/e"),
            "http://169.254.169.254/latest/meta-data/".to_string(),
        ] {
            let err = f
                .fetch(&request(url.clone(), &sha), || 0)
                .await
                .unwrap_err();
            assert!(matches!(err, FetchError::Refused { .. }), "{url}: {err}");
        }
        assert_eq!(
            hits.load(Ordering::SeqCst),
            0,
            "a refused source was contacted"
        );
        assert!(
            files_under(dir.path()).is_empty(),
            "{:?}",
            files_under(dir.path())
        );
        let _ = addr;
    }

    #[tokio::test]
    async fn errors_never_show_credentials_or_queries() {
        let (addr, _) = serve().await;
        let dir = tempfile::tempdir().unwrap();
        let req = request(
            format!("http://user:hunter2@{addr}/missing?X-Amz-Signature=SIGNED"),
            &sha256_hex(CONTENT),
        );
        let err = fetcher(dir.path()).fetch(&req, || 0).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("404"), "{text}");
        assert!(
            !text.contains("hunter2") && !text.contains("SIGNED"),
            "{text}"
        );
        let unreachable = request(
            "http://user:hunter2@127.0.0.1:1/x?token=SIGNED".into(),
            &sha256_hex(CONTENT),
        );
        let text = fetcher(dir.path())
            .fetch(&unreachable, || 0)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("SIGNED"),
            "{text}"
        );
        let ok = request(
            format!("http://u:hunter2@{addr}/model.bin?sig=SIGNED"),
            &sha256_hex(CONTENT),
        );
        let debug = format!("{ok:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("SIGNED"),
            "{debug}"
        );
        let rec = fetcher(dir.path()).fetch(&ok, || 0).await.unwrap();
        assert!(
            !rec.url.contains("hunter2") && !rec.url.contains("SIGNED"),
            "{}",
            rec.url
        );
    }

    #[tokio::test]
    async fn file_urls_are_read_only_under_the_roots() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("artifacts");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("src.bin"), CONTENT).unwrap();
        let outside = dir.path().join("secret");
        std::fs::write(&outside, CONTENT).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link.bin")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        let cache = dir.path().join("cache");
        let sha = sha256_hex(CONTENT);
        let none = fetcher_with(
            &cache,
            Arc::new(FetchPolicy::new(PolicyConfig::default()).unwrap()),
        );
        let inside = request(format!("file://{}/src.bin", root.display()), &sha);
        let err = none.fetch(&inside, || 0).await.unwrap_err();
        assert!(
            matches!(
                err,
                FetchError::Refused {
                    reason: Refusal::NoFileRoots,
                    ..
                }
            ),
            "no roots, no file://: {err}"
        );
        let rooted = fetcher_with(
            &cache,
            Arc::new(
                FetchPolicy::new(PolicyConfig {
                    file_roots: vec![root.clone()],
                    ..PolicyConfig::default()
                })
                .unwrap(),
            ),
        );
        rooted.fetch(&inside, || 0).await.unwrap();
        assert_eq!(
            std::fs::read(cache.join(&inside.local_path)).unwrap(),
            CONTENT
        );
        let under_root = |rest: &str| format!("file://{}{rest}", root.display());
        for (url, why) in [
            (
                format!("file://{}", outside.display()),
                Refusal::OutsideRoots,
            ),
            (under_root("/link.bin"), Refusal::Symlink),
            (under_root("/up/secret"), Refusal::Symlink),
            (under_root("/../secret"), Refusal::OutsideRoots),
            (under_root("/%2e%2e/secret"), Refusal::OutsideRoots),
            (under_root("/a%2F..%2F..%2Fsecret"), Refusal::NotPlainPath),
            (under_root(""), Refusal::OutsideRoots),
            (
                format!("file://otherhost{}/src.bin", root.display()),
                Refusal::NotPlainPath,
            ),
        ] {
            let err = rooted
                .fetch(&request(url.clone(), &sha), || 0)
                .await
                .unwrap_err();
            match err {
                FetchError::Refused { reason, .. } => assert_eq!(reason, why, "{url}"),
                other => panic!("{url}: {other}"),
            }
        }
    }
}
