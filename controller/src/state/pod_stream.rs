//! The pod cache's watcher in protobuf: kube-runtime's `watcher` events (list or streamed initial
//! events, then watches resumed from the last resourceVersion) from protobuf, or JSON if answered.
//!
//! Requests ask for `application/vnd.kubernetes.protobuf` with `application/json` as fallback
//! (client-go's order) and are decoded by the Content-Type of the answer ([`pod_wire`]), so an
//! API server that only speaks JSON (ebb-sim) works unchanged. The states follow kube-runtime's
//! watcher: `Init`, `InitApply`..., `InitDone`, then `Apply`/`Delete`; a watch that ends (or idles
//! past its timeout) is opened again from the last resourceVersion seen, bookmarks included;
//! 410 Gone, as an HTTP status or an `ERROR` event, starts over with a new list. Errors are
//! yielded and the next poll retries: put a backoff around the stream
//! (`WatchStreamExt::default_backoff`), as around kube's watcher.
//!
//! [`pod_wire`]: super::pod_wire

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use kube::Resource;
use kube::api::{ListParams, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::{self, Event};

use super::lists::InitialList;
use super::pod_wire::{self, DecodeError, Framer, Media, WatchItem};
use crate::cluster::CachedPod;

/// How the pod cache asks for pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PodEncoding {
    /// Protobuf, with JSON as fallback: a third cheaper for the API server to list.
    #[default]
    Protobuf,
    /// JSON through kube-runtime's watcher.
    Json,
}

/// `Accept` of the pod lists.
pub const ACCEPT_LIST: &str = "application/vnd.kubernetes.protobuf, application/json";
/// `Accept` of the pod watches (the API server's stream media types).
pub const ACCEPT_WATCH: &str =
    "application/vnd.kubernetes.protobuf;stream=watch, application/json;stream=watch";
/// Objects per LIST page (client-go's and kube's).
pub const PAGE_SIZE: u32 = 500;
/// What a watch may stay silent beyond its `timeoutSeconds` (290, kube's) before it is taken
/// for ended (kube-runtime's margin).
const IDLE_TIMEOUT: Duration = Duration::from_secs(290 + 5);

/// Which request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    List,
    Watch,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::List => "list",
            Phase::Watch => "watch",
        })
    }
}

/// Why the pod watcher failed a step (it retries on the next poll).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build the pod {0} request: {1}")]
    Request(Phase, #[source] kube::core::request::Error),
    #[error("the pod {phase} failed: {source}")]
    Transport {
        phase: Phase,
        #[source]
        source: kube::Error,
    },
    #[error("the pod {phase} was answered with HTTP {}: {} {}", status.code, status.reason, status.message)]
    Api { phase: Phase, status: Box<Status> },
    #[error("the pod watch sent an error: {} {}: {}", .0.code, .0.reason, .0.message)]
    WatchEvent(Box<Status>),
    #[error("cannot decode the pod {phase}: {source}")]
    Decode {
        phase: Phase,
        #[source]
        source: DecodeError,
    },
    #[error("no resourceVersion in the pod list or watch event")]
    NoResourceVersion,
}

impl Error {
    /// HTTP 410 Gone: the resourceVersion is too old, only a new list can go on.
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::Api { status, .. } | Error::WatchEvent(status) if status.code == 410)
    }
}

impl From<Error> for watcher::Error {
    /// kube-runtime's error of the same step, for the reflector and the logs.
    fn from(e: Error) -> Self {
        match e {
            Error::Api {
                phase: Phase::List,
                status,
            } => watcher::Error::InitialListFailed(kube::Error::Api(status)),
            Error::Api {
                phase: Phase::Watch,
                status,
            } => watcher::Error::WatchStartFailed(kube::Error::Api(status)),
            Error::Transport {
                phase: Phase::List,
                source,
            } => watcher::Error::InitialListFailed(source),
            Error::Transport {
                phase: Phase::Watch,
                source,
            } => watcher::Error::WatchFailed(source),
            Error::WatchEvent(status) => watcher::Error::WatchError(status),
            Error::NoResourceVersion => watcher::Error::NoResourceVersion,
            e @ (Error::Request(..) | Error::Decode { .. }) => {
                watcher::Error::WatchFailed(kube::Error::Service(Box::new(e)))
            }
        }
    }
}

/// The Content-Types the watcher decoded (for tests and diagnostics).
#[derive(Debug, Default)]
pub struct Decoded(Mutex<BTreeSet<String>>);

impl Decoded {
    fn record(&self, content_type: &str) {
        let fresh = self
            .0
            .lock()
            .map(|mut s| s.insert(content_type.to_string()))
            .unwrap_or(false);
        if fresh {
            tracing::info!(content_type, "the pod cache decodes");
        }
    }

    /// Every Content-Type decoded so far.
    pub fn content_types(&self) -> BTreeSet<String> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

type Events = BoxStream<'static, Result<WatchItem, Error>>;

enum State {
    /// Next: a new list (or streamed initial watch).
    Empty,
    /// Paged list: the page's pods still to yield, the next page's token, the list's version.
    Page {
        continue_token: Option<String>,
        items: VecDeque<CachedPod>,
        resource_version: Option<String>,
    },
    /// Streamed list: the initial events until the bookmark that ends them.
    InitialWatch { events: Events },
    /// Listed: next, a watch from `resource_version`.
    Listed { resource_version: String },
    Watching {
        resource_version: String,
        events: Events,
    },
}

struct Ctx {
    client: kube::Client,
    lists: InitialList,
    decoded: Arc<Decoded>,
    path: String,
}

/// The pods of the cluster as kube-runtime's `watcher` events, asked for in protobuf.
/// `lists` must be resolved (`Auto` lists). `decoded` records the Content-Types decoded.
pub fn watch(
    client: kube::Client,
    lists: InitialList,
    decoded: Arc<Decoded>,
) -> impl Stream<Item = Result<Event<CachedPod>, Error>> + Send + 'static {
    let ctx = Ctx {
        client,
        lists,
        decoded,
        path: CachedPod::url_path(&(), None),
    };
    futures::stream::unfold((ctx, State::Empty), |(ctx, mut state)| async move {
        loop {
            let (out, next) = step(&ctx, state).await;
            state = next;
            if let Some(out) = out {
                return Some((out, (ctx, state)));
            }
        }
    })
}

type Step = (Option<Result<Event<CachedPod>, Error>>, State);

async fn step(ctx: &Ctx, state: State) -> Step {
    match state {
        State::Empty => match ctx.lists {
            InitialList::Stream => match open_watch(ctx, "0", true).await {
                Ok(events) => (Some(Ok(Event::Init)), State::InitialWatch { events }),
                Err(e) => (Some(Err(e)), State::Empty),
            },
            InitialList::List | InitialList::Auto => (
                Some(Ok(Event::Init)),
                State::Page {
                    continue_token: None,
                    items: VecDeque::new(),
                    resource_version: None,
                },
            ),
        },
        State::Page {
            continue_token,
            mut items,
            resource_version,
        } => {
            if let Some(pod) = items.pop_front() {
                return (
                    Some(Ok(Event::InitApply(pod))),
                    State::Page {
                        continue_token,
                        items,
                        resource_version,
                    },
                );
            }
            if continue_token.is_none()
                && let Some(resource_version) = resource_version
            {
                return (
                    Some(Ok(Event::InitDone)),
                    State::Listed { resource_version },
                );
            }
            match list_page(ctx, continue_token).await {
                Ok(page) => {
                    if page.resource_version.is_none() && page.continue_token.is_none() {
                        return (Some(Err(Error::NoResourceVersion)), State::Empty);
                    }
                    (
                        None,
                        State::Page {
                            continue_token: page.continue_token,
                            items: page.items.into(),
                            resource_version: page.resource_version,
                        },
                    )
                }
                // An expired continue token (410) or any other failure: list again.
                Err(e) => (Some(Err(e)), State::Empty),
            }
        }
        State::InitialWatch { mut events } => match next(&mut events).await {
            Some(Ok(WatchItem::Added(p) | WatchItem::Modified(p))) => (
                Some(Ok(Event::InitApply(p))),
                State::InitialWatch { events },
            ),
            Some(Ok(WatchItem::Deleted(p))) => {
                // The API server sends none among initial events.
                tracing::warn!(pod = ?p.metadata.name, "a DELETED event among the initial pod events; ignored");
                (None, State::InitialWatch { events })
            }
            Some(Ok(WatchItem::Bookmark {
                resource_version,
                initial_events_end: true,
            })) => (
                Some(Ok(Event::InitDone)),
                State::Watching {
                    resource_version,
                    events,
                },
            ),
            Some(Ok(WatchItem::Bookmark { .. })) => (None, State::InitialWatch { events }),
            Some(Ok(WatchItem::Error(status))) => {
                let e = Error::WatchEvent(status);
                if e.is_gone() {
                    (Some(Err(e)), State::Empty)
                } else {
                    (Some(Err(e)), State::InitialWatch { events })
                }
            }
            Some(Err(e)) => (Some(Err(e)), State::InitialWatch { events }),
            // Ended before the initial events did: start over.
            None => (None, State::Empty),
        },
        State::Listed { resource_version } => {
            match open_watch(ctx, &resource_version, false).await {
                Ok(events) => (
                    None,
                    State::Watching {
                        resource_version,
                        events,
                    },
                ),
                Err(e) if e.is_gone() => (Some(Err(e)), State::Empty),
                Err(e) => (Some(Err(e)), State::Listed { resource_version }),
            }
        }
        State::Watching {
            resource_version,
            mut events,
        } => match next(&mut events).await {
            Some(Ok(WatchItem::Added(p) | WatchItem::Modified(p))) => seen(p, Event::Apply, events),
            Some(Ok(WatchItem::Deleted(p))) => seen(p, Event::Delete, events),
            Some(Ok(WatchItem::Bookmark {
                resource_version: rv,
                ..
            })) => {
                let resource_version = if rv.is_empty() { resource_version } else { rv };
                (
                    None,
                    State::Watching {
                        resource_version,
                        events,
                    },
                )
            }
            Some(Ok(WatchItem::Error(status))) => {
                let e = Error::WatchEvent(status);
                if e.is_gone() {
                    (Some(Err(e)), State::Empty)
                } else {
                    (
                        Some(Err(e)),
                        State::Watching {
                            resource_version,
                            events,
                        },
                    )
                }
            }
            Some(Err(e)) => (
                Some(Err(e)),
                State::Watching {
                    resource_version,
                    events,
                },
            ),
            // Ended (the server's timeout, a dropped connection, a broken frame): resume.
            None => (None, State::Listed { resource_version }),
        },
    }
}

/// A pod applied or deleted on a watch: its event, and the watch going on from its version.
fn seen(pod: CachedPod, event: fn(CachedPod) -> Event<CachedPod>, events: Events) -> Step {
    match pod
        .metadata
        .resource_version
        .clone()
        .filter(|v| !v.is_empty())
    {
        Some(resource_version) => (
            Some(Ok(event(pod))),
            State::Watching {
                resource_version,
                events,
            },
        ),
        None => (Some(Err(Error::NoResourceVersion)), State::Empty),
    }
}

/// The next event of a watch; `None` when it ended or idled past its timeout.
async fn next(events: &mut Events) -> Option<Result<WatchItem, Error>> {
    tokio::time::timeout(IDLE_TIMEOUT, events.next())
        .await
        .unwrap_or(None)
}

/// Sends `req` (with `accept`); the response's media type and body, or the API's refusal.
async fn send(
    ctx: &Ctx,
    phase: Phase,
    mut req: http::Request<Vec<u8>>,
    accept: &'static str,
) -> Result<(Media, String, kube::client::Body), Error> {
    let headers = req.headers_mut();
    headers.insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
    if phase == Phase::Watch {
        // As kube's watches: a compressed watch stream would need a multi-member gzip decoder.
        headers.insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
    }
    let res = ctx
        .client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(|source| Error::Transport { phase, source })?;
    let content_type = res
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let media = Media::of(content_type.as_deref());
    let code = res.status();
    if code.is_client_error() || code.is_server_error() {
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|source| Error::Transport { phase, source })?
            .to_bytes();
        let status = media
            .ok()
            .and_then(|m| pod_wire::decode_status(m, &body))
            .filter(|s| s.code != 0)
            .unwrap_or_else(|| {
                Status::failure(String::from_utf8_lossy(&body).trim(), "").with_code(code.as_u16())
            });
        return Err(Error::Api {
            phase,
            status: Box::new(status),
        });
    }
    let media = media.map_err(|source| Error::Decode { phase, source })?;
    let content_type = content_type.unwrap_or_default();
    Ok((media, content_type, res.into_body()))
}

/// One LIST page.
async fn list_page(ctx: &Ctx, continue_token: Option<String>) -> Result<pod_wire::Page, Error> {
    let mut lp = ListParams::default().limit(PAGE_SIZE);
    lp.continue_token = continue_token;
    let req = kube::core::Request::new(&ctx.path)
        .list(&lp)
        .map_err(|e| Error::Request(Phase::List, e))?;
    let (media, content_type, body) = send(ctx, Phase::List, req, ACCEPT_LIST).await?;
    let body = body
        .collect()
        .await
        .map_err(|source| Error::Transport {
            phase: Phase::List,
            source,
        })?
        .to_bytes();
    let page = pod_wire::decode_list(media, &body).map_err(|source| Error::Decode {
        phase: Phase::List,
        source,
    })?;
    ctx.decoded.record(&content_type);
    Ok(page)
}

/// Opens a watch from `resource_version`, with the current pods first when `initial`.
async fn open_watch(ctx: &Ctx, resource_version: &str, initial: bool) -> Result<Events, Error> {
    let mut wp = WatchParams::default();
    if initial {
        wp.send_initial_events = true;
    }
    let req = kube::core::Request::new(&ctx.path)
        .watch(&wp, resource_version)
        .map_err(|e| Error::Request(Phase::Watch, e))?;
    let (media, content_type, body) = send(ctx, Phase::Watch, req, ACCEPT_WATCH).await?;
    ctx.decoded.record(&content_type);
    Ok(events(media, body.into_data_stream()).boxed())
}

/// The events of a watch body. A frame that does not decode is an error and the next one is
/// read; a body that breaks (transport error, oversized or truncated frame) ends with an error.
pub fn events<B, E>(media: Media, body: B) -> impl Stream<Item = Result<WatchItem, Error>> + Send
where
    B: Stream<Item = Result<prost::bytes::Bytes, E>> + Send + Unpin + 'static,
    E: Into<kube::Error>,
{
    struct Reading<B> {
        body: B,
        framer: Framer,
        done: bool,
    }
    let decode = |e| Error::Decode {
        phase: Phase::Watch,
        source: e,
    };
    futures::stream::unfold(
        Reading {
            body,
            framer: Framer::new(media),
            done: false,
        },
        move |mut r| async move {
            if r.done {
                return None;
            }
            loop {
                match r.framer.next_frame() {
                    Ok(Some(frame)) => {
                        let item = pod_wire::decode_event(media, &frame).map_err(decode);
                        return Some((item, r));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        r.done = true;
                        return Some((Err(decode(e)), r));
                    }
                }
                match r.body.next().await {
                    Some(Ok(chunk)) => r.framer.push(&chunk),
                    Some(Err(e)) => {
                        r.done = true;
                        let source: kube::Error = e.into();
                        return Some((
                            Err(Error::Transport {
                                phase: Phase::Watch,
                                source,
                            }),
                            r,
                        ));
                    }
                    None => {
                        r.done = true;
                        return r.framer.finish().err().map(|e| (Err(decode(e)), r));
                    }
                }
            }
        },
    )
}
