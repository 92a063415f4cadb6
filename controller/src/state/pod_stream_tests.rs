//! The pod watcher against canned responses built with prost from k8s-pb messages: streamed
//! initial events ending at their bookmark, paged lists, re-watches from the last
//! resourceVersion, 410 Gone as an event or an HTTP status, broken frames, the JSON fallback.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http::{Request, Response};
use http_body_util::StreamBody;
use hyper::body::Frame;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pmeta;
use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
use kube::client::Body;
use kube::runtime::watcher::Event;
use prost::Message;
use prost::bytes::Bytes;

use super::lists::InitialList;
use super::pod_stream::{self, ACCEPT_LIST, ACCEPT_WATCH, Decoded, Error};
use super::pod_wire::{self, DecodeError, Framer, MAGIC, Media, WatchItem};
use crate::cluster::CachedPod;

const PB: &str = "application/vnd.kubernetes.protobuf";
const PB_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";
const JSON: &str = "application/json";

// ---- canned protobuf, built with prost from k8s-pb messages ----

fn pod(name: &str, rv: &str) -> pb::Pod {
    pb::Pod {
        metadata: Some(pmeta::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        }),
        spec: Some(pb::PodSpec {
            containers: vec![pb::Container {
                name: Some("c".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(pb::PodStatus::default()),
    }
}

/// `k8s\0` + `runtime.Unknown` around `raw`.
fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    }
    .encode(&mut out)
    .expect("a Vec grows");
    out
}

fn list(pods: &[pb::Pod], rv: &str, cont: &str) -> Vec<u8> {
    envelope(
        "PodList",
        pb::PodList {
            metadata: Some(pmeta::ListMeta {
                resource_version: Some(rv.into()),
                r#continue: Some(cont.into()),
                ..Default::default()
            }),
            items: pods.to_vec(),
        }
        .encode_to_vec(),
    )
}

/// A length-prefixed `WatchEvent` frame.
fn frame(type_: &str, object: Vec<u8>) -> Vec<u8> {
    let event = pmeta::WatchEvent {
        r#type: Some(type_.into()),
        object: Some(RawExtension { raw: Some(object) }),
    }
    .encode_to_vec();
    let mut out = u32::try_from(event.len())
        .expect("small")
        .to_be_bytes()
        .to_vec();
    out.extend(event);
    out
}

fn event(type_: &str, p: &pb::Pod) -> Vec<u8> {
    frame(type_, envelope("Pod", p.encode_to_vec()))
}

fn bookmark(rv: &str, end: bool) -> Vec<u8> {
    let mut p = pb::Pod {
        metadata: Some(pmeta::ObjectMeta {
            resource_version: Some(rv.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    if end && let Some(m) = p.metadata.as_mut() {
        m.annotations
            .insert("k8s.io/initial-events-end".into(), "true".into());
    }
    event("BOOKMARK", &p)
}

fn status(code: i32) -> Vec<u8> {
    envelope(
        "Status",
        pmeta::Status {
            status: Some("Failure".into()),
            message: Some("too old resource version: 7 (99)".into()),
            reason: Some("Expired".into()),
            code: Some(code),
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

fn error_event(code: i32) -> Vec<u8> {
    frame("ERROR", status(code))
}

// ---- a scripted API server ----

/// One response: status, Content-Type, body chunks, and whether the body then stays open.
struct Reply {
    code: u16,
    content_type: &'static str,
    chunks: Vec<Vec<u8>>,
    hang: bool,
}

fn ok(content_type: &'static str, chunks: Vec<Vec<u8>>) -> Reply {
    Reply {
        code: 200,
        content_type,
        chunks,
        hang: false,
    }
}

fn open(content_type: &'static str, chunks: Vec<Vec<u8>>) -> Reply {
    Reply {
        hang: true,
        ..ok(content_type, chunks)
    }
}

/// What the server saw: each request's path and query, and its Accept.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

fn server(replies: Vec<Reply>) -> (kube::Client, Seen) {
    let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let svc = tower::service_fn(move |req: Request<Body>| {
        let replies = replies.clone();
        let log = log.clone();
        async move {
            let accept = req
                .headers()
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((req.uri().to_string(), accept));
            let reply = replies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
                // Out of script: a watch that says nothing.
                .unwrap_or_else(|| open(PB_WATCH, vec![]));
            let chunks = futures::stream::iter(
                reply
                    .chunks
                    .into_iter()
                    .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c)))),
            );
            let body: BoxStream<'static, Result<Frame<Bytes>, Infallible>> = if reply.hang {
                chunks.chain(futures::stream::pending()).boxed()
            } else {
                chunks.boxed()
            };
            let mut res = Response::new(StreamBody::new(body));
            *res.status_mut() = http::StatusCode::from_u16(reply.code).unwrap_or_default();
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(reply.content_type),
            );
            Ok::<_, Infallible>(res)
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

fn describe(item: Result<Event<CachedPod>, Error>) -> String {
    let name = |p: &CachedPod| p.metadata.name.clone().unwrap_or_default();
    match item {
        Ok(Event::Init) => "Init".into(),
        Ok(Event::InitApply(p)) => format!("InitApply {}", name(&p)),
        Ok(Event::InitDone) => "InitDone".into(),
        Ok(Event::Apply(p)) => format!("Apply {}", name(&p)),
        Ok(Event::Delete(p)) => format!("Delete {}", name(&p)),
        Err(e @ Error::Decode { .. }) => format!("Err decode: {e}"),
        Err(e) if e.is_gone() => "Err 410".into(),
        Err(e) => format!("Err {e}"),
    }
}

/// The next `n` items, each within a few seconds.
async fn take(
    stream: &mut (impl Stream<Item = Result<Event<CachedPod>, Error>> + Unpin),
    n: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Some(item)) => out.push(describe(item)),
            Ok(None) => panic!("the stream ended after {out:?}"),
            Err(_) => panic!("no item within 5 s after {out:?}"),
        }
    }
    out
}

/// Polls until the server has seen `n` requests (the watcher runs only when polled).
async fn requests_after(
    stream: &mut (impl Stream<Item = Result<Event<CachedPod>, Error>> + Unpin),
    seen: &Seen,
    n: usize,
) -> Vec<(String, String)> {
    for _ in 0..20 {
        if seen.lock().unwrap_or_else(|e| e.into_inner()).len() >= n {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
    }
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        seen.len() >= n,
        "{} requests, not {n}: {seen:?}",
        seen.len()
    );
    seen
}

fn has(uri: &str, params: &[&str]) -> bool {
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    params.iter().all(|p| query.split('&').any(|kv| kv == *p))
}

#[tokio::test]
async fn streamed_initial_events_end_at_their_bookmark_then_the_watch_resumes() {
    let (client, seen) = server(vec![
        ok(
            PB_WATCH,
            vec![
                event("ADDED", &pod("a", "5")),
                // A frame split across chunks.
                event("ADDED", &pod("b", "6"))[..7].to_vec(),
                event("ADDED", &pod("b", "6"))[7..].to_vec(),
                bookmark("10", false),
                bookmark("12", true),
                event("MODIFIED", &pod("a", "13")),
                event("DELETED", &pod("b", "14")),
                bookmark("15", false),
            ],
        ),
        open(PB_WATCH, vec![event("ADDED", &pod("c", "16"))]),
    ]);
    let decoded = Arc::new(Decoded::default());
    let mut s = std::pin::pin!(pod_stream::watch(
        client,
        InitialList::Stream,
        decoded.clone()
    ));
    assert_eq!(
        take(&mut s, 7).await,
        [
            "Init",
            "InitApply a",
            "InitApply b",
            "InitDone",
            "Apply a",
            "Delete b",
            "Apply c"
        ]
    );
    let seen = requests_after(&mut s, &seen, 2).await;
    let (first, accept) = &seen[0];
    assert!(first.starts_with("/api/v1/pods?"), "{first}");
    assert!(
        has(
            first,
            &[
                "watch=true",
                "sendInitialEvents=true",
                "resourceVersionMatch=NotOlderThan",
                "allowWatchBookmarks=true",
                "resourceVersion=0",
                "timeoutSeconds=290"
            ]
        ),
        "{first}"
    );
    assert_eq!(accept, ACCEPT_WATCH);
    // Resumed from the last bookmark, without initial events.
    let (second, _) = &seen[1];
    assert!(
        has(
            second,
            &[
                "watch=true",
                "resourceVersion=15",
                "allowWatchBookmarks=true"
            ]
        ),
        "{second}"
    );
    assert!(!second.contains("sendInitialEvents"), "{second}");
    assert_eq!(
        decoded.content_types().into_iter().collect::<Vec<_>>(),
        [PB_WATCH]
    );
}

#[tokio::test]
async fn streamed_gone_streams_again_from_the_start() {
    let (client, seen) = server(vec![
        ok(
            PB_WATCH,
            vec![event("ADDED", &pod("a", "5")), bookmark("6", true)],
        ),
        open(PB_WATCH, vec![error_event(410)]),
        open(
            PB_WATCH,
            vec![event("ADDED", &pod("b", "30")), bookmark("31", true)],
        ),
    ]);
    let mut s = std::pin::pin!(pod_stream::watch(
        client,
        InitialList::Stream,
        Arc::default()
    ));
    assert_eq!(
        take(&mut s, 7).await,
        [
            "Init",
            "InitApply a",
            "InitDone",
            "Err 410",
            "Init",
            "InitApply b",
            "InitDone"
        ]
    );
    let seen = requests_after(&mut s, &seen, 3).await;
    assert!(has(&seen[1].0, &["resourceVersion=6"]), "{seen:?}");
    assert!(
        has(&seen[2].0, &["sendInitialEvents=true", "resourceVersion=0"]),
        "{seen:?}"
    );
}

#[tokio::test]
async fn pages_then_a_watch_from_the_lists_version_and_gone_relists() {
    let (client, seen) = server(vec![
        ok(PB, vec![list(&[pod("a", "1")], "", "c1")]),
        ok(PB, vec![list(&[pod("b", "2")], "7", "")]),
        open(
            PB_WATCH,
            vec![event("ADDED", &pod("c", "8")), error_event(410)],
        ),
        ok(PB, vec![list(&[pod("x", "20")], "21", "")]),
        open(PB_WATCH, vec![]),
    ]);
    let decoded = Arc::new(Decoded::default());
    let mut s = std::pin::pin!(pod_stream::watch(
        client,
        InitialList::List,
        decoded.clone()
    ));
    assert_eq!(
        take(&mut s, 9).await,
        [
            "Init",
            "InitApply a",
            "InitApply b",
            "InitDone",
            "Apply c",
            "Err 410",
            "Init",
            "InitApply x",
            "InitDone"
        ]
    );
    let seen = requests_after(&mut s, &seen, 5).await;
    assert!(has(&seen[0].0, &["limit=500"]), "{:?}", seen[0]);
    assert!(!seen[0].0.contains("continue="), "{:?}", seen[0]);
    assert_eq!(seen[0].1, ACCEPT_LIST);
    assert!(
        has(&seen[1].0, &["limit=500", "continue=c1"]),
        "{:?}",
        seen[1]
    );
    assert!(
        has(&seen[2].0, &["watch=true", "resourceVersion=7"]),
        "{:?}",
        seen[2]
    );
    assert!(!seen[3].0.contains("watch="), "a new list: {:?}", seen[3]);
    assert!(
        has(&seen[4].0, &["watch=true", "resourceVersion=21"]),
        "{:?}",
        seen[4]
    );
    let types = decoded.content_types();
    assert!(types.contains(PB) && types.contains(PB_WATCH), "{types:?}");
}

#[tokio::test]
async fn http_gone_on_a_watch_relists_and_other_refusals_retry_the_watch() {
    let (client, seen) = server(vec![
        ok(PB, vec![list(&[pod("a", "1")], "7", "")]),
        Reply {
            code: 500,
            ..ok(
                JSON,
                vec![
                    br#"{"kind":"Status","code":500,"reason":"InternalError","message":"boom"}"#
                        .to_vec(),
                ],
            )
        },
        Reply {
            code: 410,
            ..ok(PB, vec![status(410)])
        },
        ok(PB, vec![list(&[pod("b", "2")], "9", "")]),
        open(PB_WATCH, vec![]),
    ]);
    let mut s = std::pin::pin!(pod_stream::watch(client, InitialList::List, Arc::default()));
    let got = take(&mut s, 7).await;
    assert_eq!(got[..3], ["Init", "InitApply a", "InitDone"]);
    assert!(
        got[3].contains("HTTP 500") && got[3].contains("boom"),
        "{got:?}"
    );
    assert_eq!(got[4..], ["Err 410", "Init", "InitApply b"]);
    let seen = requests_after(&mut s, &seen, 5).await;
    // The 500 retried the same watch; the 410 listed again.
    assert!(has(&seen[1].0, &["resourceVersion=7"]), "{seen:?}");
    assert!(has(&seen[2].0, &["resourceVersion=7"]), "{seen:?}");
    assert!(!seen[3].0.contains("watch="), "{seen:?}");
}

#[tokio::test]
async fn a_truncated_frame_is_an_error_then_the_watch_resumes() {
    let cut = event("ADDED", &pod("b", "9"));
    let (client, seen) = server(vec![
        ok(PB, vec![list(&[], "7", "")]),
        ok(
            PB_WATCH,
            vec![
                event("ADDED", &pod("a", "8")),
                cut[..cut.len() - 3].to_vec(),
            ],
        ),
        open(PB_WATCH, vec![]),
    ]);
    let mut s = std::pin::pin!(pod_stream::watch(client, InitialList::List, Arc::default()));
    let got = take(&mut s, 4).await;
    assert_eq!(got[..3], ["Init", "InitDone", "Apply a"]);
    assert!(got[3].contains("ended inside a frame"), "{got:?}");
    let seen = requests_after(&mut s, &seen, 3).await;
    assert!(
        has(&seen[2].0, &["watch=true", "resourceVersion=8"]),
        "{seen:?}"
    );
}

#[tokio::test]
async fn an_oversized_frame_is_refused_and_the_watch_resumes() {
    let mut huge = u32::MAX.to_be_bytes().to_vec();
    huge.extend([0u8; 16]);
    let (client, seen) = server(vec![
        ok(PB, vec![list(&[], "7", "")]),
        open(PB_WATCH, vec![huge]),
        open(PB_WATCH, vec![]),
    ]);
    let mut s = std::pin::pin!(pod_stream::watch(client, InitialList::List, Arc::default()));
    let got = take(&mut s, 3).await;
    assert_eq!(got[..2], ["Init", "InitDone"]);
    assert!(got[2].contains("exceeds the limit"), "{got:?}");
    let seen = requests_after(&mut s, &seen, 3).await;
    assert!(
        has(&seen[2].0, &["watch=true", "resourceVersion=7"]),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_frame_that_does_not_decode_is_skipped_with_an_error() {
    let (client, _) = server(vec![
        ok(PB, vec![list(&[], "7", "")]),
        open(
            PB_WATCH,
            vec![
                frame("ADDED", b"not an envelope".to_vec()),
                event("ADDED", &pod("a", "8")),
            ],
        ),
    ]);
    let mut s = std::pin::pin!(pod_stream::watch(client, InitialList::List, Arc::default()));
    let got = take(&mut s, 4).await;
    assert!(got[2].contains("does not start with k8s"), "{got:?}");
    assert_eq!(got[3], "Apply a");
}

#[tokio::test]
async fn a_json_only_server_gives_the_same_events() {
    let line = |v: serde_json::Value| format!("{v}\n").into_bytes();
    let json_pod = |name: &str, rv: &str| {
        serde_json::json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
            "spec": {"containers": [{"name": "c"}]}, "status": {}})
    };
    let (client, seen) = server(vec![
        ok(
            JSON,
            vec![
                serde_json::to_vec(&serde_json::json!({"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": "7"}, "items": [json_pod("a", "1")]}))
                .unwrap_or_default(),
            ],
        ),
        ok(
            JSON,
            vec![
                line(serde_json::json!({"type": "ADDED", "object": json_pod("b", "8")})),
                line(serde_json::json!({"type": "BOOKMARK",
                    "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}}})),
            ],
        ),
        open(
            JSON,
            vec![
                line(serde_json::json!({"type": "DELETED", "object": json_pod("b", "10")})),
                line(
                    serde_json::json!({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                    "reason": "Expired", "message": "too old"}}),
                ),
            ],
        ),
        ok(
            JSON,
            vec![
                serde_json::to_vec(&serde_json::json!({"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": "30"}, "items": []}))
                .unwrap_or_default(),
            ],
        ),
        open(JSON, vec![]),
    ]);
    let decoded = Arc::new(Decoded::default());
    let mut s = std::pin::pin!(pod_stream::watch(
        client,
        InitialList::List,
        decoded.clone()
    ));
    assert_eq!(
        take(&mut s, 8).await,
        [
            "Init",
            "InitApply a",
            "InitDone",
            "Apply b",
            "Delete b",
            "Err 410",
            "Init",
            "InitDone"
        ]
    );
    let seen = requests_after(&mut s, &seen, 4).await;
    assert!(has(&seen[2].0, &["resourceVersion=9"]), "{seen:?}");
    assert_eq!(
        decoded.content_types().into_iter().collect::<Vec<_>>(),
        [JSON]
    );
}

// ---- frames and envelopes ----

#[test]
fn frames_are_cut_at_any_chunk_boundary() {
    let body: Vec<u8> = [
        event("ADDED", &pod("a", "1")),
        bookmark("2", true),
        error_event(410),
    ]
    .concat();
    for split in 0..body.len() {
        let mut f = Framer::new(Media::Protobuf);
        let mut frames = Vec::new();
        for chunk in [&body[..split], &body[split..]] {
            f.push(chunk);
            while let Some(frame) = f.next_frame().expect("frames") {
                frames.push(pod_wire::decode_event(Media::Protobuf, &frame).expect("decodes"));
            }
        }
        assert_eq!(f.finish(), Ok(()), "split at {split}");
        assert!(
            matches!(&frames[..], [
                WatchItem::Added(p),
                WatchItem::Bookmark { resource_version, initial_events_end: true },
                WatchItem::Error(s),
            ] if p.metadata.name.as_deref() == Some("a") && resource_version == "2" && s.code == 410),
            "split at {split}: {frames:?}"
        );
    }
}

#[test]
fn a_truncated_frame_and_an_oversized_length_are_errors() {
    let whole = event("ADDED", &pod("a", "1"));
    let mut f = Framer::new(Media::Protobuf);
    f.push(&whole[..whole.len() - 1]);
    assert_eq!(f.next_frame(), Ok(None));
    assert_eq!(f.finish(), Err(DecodeError::Truncated(whole.len() - 1)));

    let mut f = Framer::new(Media::Protobuf);
    f.push(&(pod_wire::MAX_FRAME as u32 + 1).to_be_bytes());
    assert_eq!(
        f.next_frame(),
        Err(DecodeError::Oversized(pod_wire::MAX_FRAME + 1))
    );

    // A length-delimited field that claims more bytes than the frame has.
    let mut bad = whole[4..].to_vec();
    bad.truncate(bad.len() / 2);
    assert!(matches!(
        pod_wire::decode_event(Media::Protobuf, &bad),
        Err(DecodeError::Protobuf(_))
    ));
}

#[test]
fn json_lines_are_cut_at_newlines() {
    let mut f = Framer::new(Media::Json);
    f.push(b"{\"a\":1}\n\n{\"b\"");
    assert_eq!(
        f.next_frame().ok().flatten().as_deref(),
        Some(&b"{\"a\":1}"[..])
    );
    assert_eq!(f.next_frame(), Ok(None));
    f.push(b":2}\n");
    assert_eq!(
        f.next_frame().ok().flatten().as_deref(),
        Some(&b"{\"b\":2}"[..])
    );
    assert_eq!(f.finish(), Ok(()));
    f.push(b"{\"c\"");
    assert_eq!(f.finish(), Err(DecodeError::Truncated(4)));
}

#[test]
fn a_protobuf_list_decodes_as_the_json_one() {
    let full = crate::cluster::cached_pod_pb_tests::full_pod();
    let page = pod_wire::decode_list(
        Media::Protobuf,
        &list(&[full.clone(), pod("b", "2")], "99", "next"),
    )
    .expect("decodes");
    assert_eq!(page.resource_version.as_deref(), Some("99"));
    assert_eq!(page.continue_token.as_deref(), Some("next"));
    let mut want: CachedPod =
        serde_json::from_value(crate::cluster::cached_pod_pb_tests::full_pod_json())
            .expect("JSON decodes");
    want.trim();
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.items[0], want);

    // Not a pod list: refused.
    assert!(matches!(
        pod_wire::decode_list(Media::Protobuf, &status(410)),
        Err(DecodeError::Kind { .. })
    ));
    assert_eq!(
        pod_wire::decode_list(Media::Protobuf, b"{}").err(),
        Some(DecodeError::NoMagic)
    );
}

#[test]
fn content_types_choose_the_decoder() {
    assert_eq!(Media::of(Some(PB)), Ok(Media::Protobuf));
    assert_eq!(Media::of(Some(PB_WATCH)), Ok(Media::Protobuf));
    assert_eq!(
        Media::of(Some("application/json;charset=utf-8")),
        Ok(Media::Json)
    );
    assert_eq!(Media::of(None), Ok(Media::Json));
    assert!(Media::of(Some("application/yaml")).is_err());
}
