//! The HTTPS server of the steering webhook: `POST /steer` (axum over rustls), bodies up to
//! [`MAX_BODY`]; the leader asks `Steering`, every answer is counted by result.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::review;
use crate::metrics::{Metrics, SteeringAdmission};
use crate::state::Leadership;
use crate::steering::Steering;

/// The path the webhook configuration calls.
pub const PATH: &str = "/steer";
/// Largest request body read: an AdmissionReview of a pod is far below (the API server stores
/// objects up to 1.5 MiB); a larger body is answered 413 unread.
pub const MAX_BODY: usize = 4 << 20;
/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request whose headers have not arrived by then has its connection closed (the API server
/// sends a request at once; it opens a new connection when an idle one was closed).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A request body not received by then is answered 408 (the API server sends it at once).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once: the API server keeps a few per webhook; anything past this is
/// someone else, closed at once.
const MAX_CONNECTIONS: usize = 128;

#[derive(Clone)]
struct AppState {
    steering: Steering,
    leadership: Leadership,
    metrics: Metrics,
}

/// `POST /steer`: the leader answers with what `steering` decides, other replicas (which hold
/// no plan) with no patch; every answer allows the pod.
pub fn router(steering: Steering, leadership: Leadership, metrics: Metrics) -> Router {
    Router::new().route(PATH, post(steer)).with_state(AppState {
        steering,
        leadership,
        metrics,
    })
}

/// The request body, at most [`MAX_BODY`] bytes: a larger declared length is refused before
/// anything is read.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, (StatusCode, String)> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY} bytes"),
        )
    };
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) if e.to_string().contains("length limit") => Err(too_large()),
        Ok(Err(e)) => Err((
            StatusCode::BAD_REQUEST,
            format!("cannot read the body: {e}"),
        )),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            "the body did not arrive in time".to_string(),
        )),
    }
}

async fn steer(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(&headers, body).await {
        Ok(b) => b,
        Err((status, message)) => {
            s.metrics.steering_admitted(SteeringAdmission::error);
            tracing::warn!(error = %message, "steering webhook: unreadable request");
            return (status, message).into_response();
        }
    };
    let request = match review::parse(&body) {
        Ok(r) => r,
        Err(e) => {
            s.metrics.steering_admitted(SteeringAdmission::error);
            tracing::warn!(error = %e, "steering webhook: bad request");
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
    };
    let patch = match review::created_pod(&request) {
        Some(pod) if s.leadership.is_leader() => s.steering.admit(pod, request.dry_run),
        _ => None,
    };
    let (answer, result) = review::answer(&request, patch);
    s.metrics.steering_admitted(result);
    tracing::debug!(uid = %request.uid, namespace = ?request.namespace, ?result, "steering webhook answered");
    axum::Json(answer).into_response()
}

/// What one client may hold of the server, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; one more is closed at once (the API server fails open).
    pub connections: usize,
    /// A client that has not finished its TLS handshake by then is dropped.
    pub handshake: Duration,
    /// A request whose headers have not all arrived by then (including the wait for the next
    /// request on a kept-alive connection) has its connection closed.
    pub headers: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: MAX_CONNECTIONS,
            handshake: HANDSHAKE_TIMEOUT,
            headers: HEADER_TIMEOUT,
        }
    }
}

/// Serves one handshaken connection with `app` until it ends, the client stalls, or `stop`.
async fn serve_connection(
    tls: TlsStream<TcpStream>,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.headers)
        .keep_alive(true);
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "steering webhook: connection ended");
            }
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(BODY_TIMEOUT, conn.as_mut()).await;
        }
    }
}

/// Accepts on `tcp` until `stop`: at most `limits.connections` at once (the rest are closed
/// unread), each handshaken and served on a task of its own (a slow client holds up no other).
fn accept(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = tcp.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a moment, as axum does.
                        tracing::warn!(error = %e, "steering webhook: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%peer, limit = limits.connections, "steering webhook: too many connections; closing this one");
                drop(stream);
                continue;
            };
            let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stop.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(limits.handshake, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => serve_connection(tls, app, limits, stop).await,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "steering webhook: TLS handshake failed")
                    }
                    Err(_) => tracing::debug!(%peer, "steering webhook: TLS handshake timed out"),
                }
            });
        }
    });
}

/// Binds `addr` and serves `app` over TLS with `tls` until `stop`, within the default
/// [`Limits`]; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    serve_within(addr, tls, app, Limits::default(), stop).await
}

/// [`serve`] within `limits`.
pub async fn serve_within(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let tcp = TcpListener::bind(addr).await?;
    let local = tcp.local_addr()?;
    accept(tcp, TlsAcceptor::from(tls), app, limits, stop);
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::cert::ServingCert;
    use serde_json::{Value, json};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn review_body() -> String {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "3f1c", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop", "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"generateName": "web-", "namespace": "shop"},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}},
                "dryRun": false
            }
        })
        .to_string()
    }

    /// A client that trusts only `ca` and checks the server's name is `server_name`.
    fn client(ca: &ServingCert) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.ca_der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// One HTTP/1.1 request over TLS, as `server_name`; the status and the body.
    async fn call(
        addr: SocketAddr,
        cert: &ServingCert,
        server_name: &str,
        request: String,
    ) -> std::io::Result<(u16, String)> {
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).unwrap();
        let mut tls = client(cert).connect(name, tcp).await?;
        tls.write_all(request.as_bytes()).await?;
        // TLS records rustls still holds go out only on a flush: without it the tail of a large
        // body could stay in the client (and the server answer 408 for a body never sent).
        tls.flush().await?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out).await?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        Ok((status, body))
    }

    fn post(body: &str) -> String {
        format!(
            "POST /steer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    async fn start(leader: bool) -> (SocketAddr, ServingCert, Metrics, CancellationToken) {
        let names = crate::admission::cert::dns_names(
            &"ebb-system/ebb-steering".parse().unwrap(),
            "ebb-system",
        );
        let cert = ServingCert::generate(&names).unwrap();
        let metrics = Metrics::new();
        let leadership = Leadership::default();
        leadership.set(leader);
        let stop = CancellationToken::new();
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            cert.server_config().unwrap(),
            router(Steering::default(), leadership, metrics.clone()),
            stop.clone(),
        )
        .await
        .unwrap();
        (addr, cert, metrics, stop)
    }

    #[tokio::test]
    async fn answers_allowed_over_tls_for_every_name_of_the_service() {
        let (addr, cert, metrics, stop) = start(true).await;
        for name in [
            "ebb-steering.ebb-system.svc",
            "ebb-steering.ebb-system.svc.cluster.local",
            "127.0.0.1",
        ] {
            let (status, body) = call(addr, &cert, name, post(&review_body()))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(status, 200, "{body}");
            let answer: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(answer["response"]["uid"], "3f1c");
            assert_eq!(answer["response"]["allowed"], true);
            assert!(answer["response"].get("patch").is_none(), "{answer}");
        }
        // A name the certificate does not carry is refused by the client.
        assert!(
            call(addr, &cert, "elsewhere.example", post(&review_body()))
                .await
                .is_err()
        );
        assert!(
            metrics
                .encode()
                .contains("ebb_steering_admissions_total{result=\"unchanged\"} 3"),
            "{}",
            metrics.encode()
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_standby_answers_allowed_without_a_patch() {
        let (addr, cert, metrics, stop) = start(false).await;
        let (status, body) = call(addr, &cert, "127.0.0.1", post(&review_body()))
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["response"]["allowed"], true);
        assert!(answer["response"].get("patch").is_none(), "{answer}");
        assert!(
            metrics
                .encode()
                .contains("ebb_steering_admissions_total{result=\"unchanged\"} 1")
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn bad_requests_get_a_clear_4xx_and_the_server_keeps_serving() {
        let (addr, cert, metrics, stop) = start(true).await;
        let (status, body) = call(addr, &cert, "127.0.0.1", post("{\"kind\": 3"))
            .await
            .unwrap();
        assert_eq!(status, 400);
        assert!(body.contains("not an AdmissionReview"), "{body}");
        // Too large: refused unread.
        let huge = format!(
            "POST /steer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        let (status, body) = call(addr, &cert, "127.0.0.1", huge).await.unwrap();
        assert_eq!(status, 413, "{body}");
        // Too large without a declared length (chunked): refused once past the limit.
        let chunk = "x".repeat(1 << 20);
        let mut chunked =
            "POST /steer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_string();
        // Just past the limit, so the rest fits the socket's buffers when the server stops
        // reading.
        for c in [&chunk, &chunk, &chunk, &chunk, &chunk[..1 << 16]] {
            chunked.push_str(&format!("{:x}\r\n{c}\r\n", c.len()));
        }
        chunked.push_str("0\r\n\r\n");
        let (status, body) = call(addr, &cert, "127.0.0.1", chunked).await.unwrap();
        assert_eq!(status, 413, "{body}");
        // Only POST /steer.
        let get = "GET /steer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string();
        assert_eq!(call(addr, &cert, "127.0.0.1", get).await.unwrap().0, 405);
        // A client that never finishes its handshake holds up no one.
        let _idle = TcpStream::connect(addr).await.unwrap();
        let (status, _) = call(addr, &cert, "127.0.0.1", post(&review_body()))
            .await
            .unwrap();
        assert_eq!(status, 200);
        let text = metrics.encode();
        assert!(
            text.contains("ebb_steering_admissions_total{result=\"error\"} 3"),
            "{text}"
        );
        stop.cancel();
    }

    /// A server within `limits`, and a client that trusts it.
    async fn start_within(limits: Limits) -> (SocketAddr, ServingCert, CancellationToken) {
        let names = vec!["127.0.0.1".to_string()];
        let cert = ServingCert::generate(&names).unwrap();
        let stop = CancellationToken::new();
        let addr = serve_within(
            "127.0.0.1:0".parse().unwrap(),
            cert.server_config().unwrap(),
            router(Steering::default(), Leadership::default(), Metrics::new()),
            limits,
            stop.clone(),
        )
        .await
        .unwrap();
        (addr, cert, stop)
    }

    #[tokio::test]
    async fn a_client_that_sends_no_headers_is_cut_off() {
        let limits = Limits {
            headers: Duration::from_millis(300),
            ..Limits::default()
        };
        let (addr, cert, stop) = start_within(limits).await;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1".to_string()).unwrap();
        let mut tls = client(&cert).connect(name, tcp).await.unwrap();
        // Half a request line, then nothing.
        tls.write_all(b"POST /ste").await.unwrap();
        let mut buf = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut buf)).await;
        assert!(
            closed.is_ok(),
            "the connection was held past the header timeout"
        );
        // And one that sends nothing at all after its handshake.
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1".to_string()).unwrap();
        let mut tls = client(&cert).connect(name, tcp).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut buf)).await;
        assert!(closed.is_ok(), "an idle connection was held");
        stop.cancel();
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_and_the_rest_served() {
        let limits = Limits {
            connections: 3,
            ..Limits::default()
        };
        let (addr, cert, stop) = start_within(limits).await;
        // Three clients hold a connection each without finishing a handshake.
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A fourth is closed at once.
        let refused = call(addr, &cert, "127.0.0.1", post(&review_body())).await;
        assert!(refused.is_err(), "served past the limit: {refused:?}");
        // Once one lets go, requests are served again.
        drop(held.pop());
        let served = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok((200, _)) = call(addr, &cert, "127.0.0.1", post(&review_body())).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(served.is_ok(), "not served after a connection closed");
        stop.cancel();
    }

    #[tokio::test]
    async fn stops_serving_when_stopped() {
        let (addr, cert, _metrics, stop) = start(true).await;
        stop.cancel();
        let gone = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if call(addr, &cert, "127.0.0.1", post(&review_body()))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(gone.is_ok(), "still answering after stop");
    }
}
