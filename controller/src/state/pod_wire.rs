//! The bytes of the pod cache's responses, decoded by their Content-Type: protobuf list bodies
//! and length-prefixed watch frames, or JSON list bodies and watch lines, into cached pods.
//!
//! Protobuf, as kube-apiserver writes it (k8s.io/apimachinery's protobuf serializer): a body is
//! `k8s\0` then a `runtime.Unknown` (field 1 `typeMeta`, 2 `raw`, 3 `contentEncoding`, 4
//! `contentType`) whose `raw` is the object (a `PodList`: 1 `metadata`, 2 `items`). A watch body
//! is frames of a 4-byte big-endian length and a `WatchEvent` (1 `type`, 2 `object`, a
//! `RawExtension` whose field 1 `raw` holds an object as above: a Pod, or a Status for `ERROR`).
//! The envelopes are read in place; only pods are decoded into `k8s-pb` messages, one at a
//! time, and converted at once ([`CachedPod::from_protobuf`]).

use std::collections::BTreeMap;

use k8s_pb::apimachinery::pkg::apis::meta::v1 as pmeta;
use kube::core::{ObjectList, Status, WatchEvent, response::StatusSummary};
use prost::Message;
use prost::bytes::{Buf, BytesMut};

use crate::cluster::CachedPod;
use crate::cluster::cached_pod_pb::ConvertError;

/// The 4 bytes before every protobuf object Kubernetes writes.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// The largest watch frame or line accepted (client-go's streaming decoder's bound).
pub const MAX_FRAME: usize = 16 * 1024 * 1024;

/// The annotation of the bookmark that ends a watch's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// What a body could not be read as.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("unexpected content type {0:?} (asked for protobuf or JSON)")]
    ContentType(String),
    #[error("the protobuf body does not start with k8s\\0")]
    NoMagic,
    #[error("malformed protobuf: {0}")]
    Protobuf(String),
    #[error("a protobuf {kind} body where {expected} was expected")]
    Kind {
        kind: String,
        expected: &'static str,
    },
    #[error("content encoding {0:?} inside the protobuf envelope is not supported")]
    ContentEncoding(String),
    #[error("malformed JSON: {0}")]
    Json(String),
    #[error("unknown watch event type {0:?}")]
    EventType(String),
    #[error("a watch frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    Oversized(usize),
    #[error("the watch stream ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
    #[error(transparent)]
    Convert(#[from] ConvertError),
}

impl From<prost::DecodeError> for DecodeError {
    fn from(e: prost::DecodeError) -> Self {
        DecodeError::Protobuf(e.to_string())
    }
}

impl From<serde_json::Error> for DecodeError {
    fn from(e: serde_json::Error) -> Self {
        DecodeError::Json(e.to_string())
    }
}

type R<T> = Result<T, DecodeError>;

/// How a response is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Media {
    Protobuf,
    Json,
}

impl Media {
    /// From a Content-Type (`application/vnd.kubernetes.protobuf;stream=watch`,
    /// `application/json`, ...); none at all is read as JSON, as kube's client reads every body.
    pub fn of(content_type: Option<&str>) -> R<Media> {
        let Some(ct) = content_type else {
            return Ok(Media::Json);
        };
        let essence = ct.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case("application/vnd.kubernetes.protobuf") {
            Ok(Media::Protobuf)
        } else if essence.eq_ignore_ascii_case("application/json") {
            Ok(Media::Json)
        } else {
            Err(DecodeError::ContentType(ct.to_string()))
        }
    }
}

/// One page of a pod list.
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<CachedPod>,
    /// The list's resourceVersion (empty: none).
    pub resource_version: Option<String>,
    /// The continue token of the next page (empty: none).
    pub continue_token: Option<String>,
}

/// One watch event.
#[derive(Debug)]
pub enum WatchItem {
    Added(CachedPod),
    Modified(CachedPod),
    Deleted(CachedPod),
    Bookmark {
        resource_version: String,
        /// Annotated `k8s.io/initial-events-end: "true"`: the initial events are over.
        initial_events_end: bool,
    },
    Error(Box<Status>),
}

/// A list body.
pub fn decode_list(media: Media, body: &[u8]) -> R<Page> {
    match media {
        Media::Json => {
            let list: ObjectList<CachedPod> = serde_json::from_slice(body)?;
            Ok(Page {
                items: list.items,
                resource_version: list.metadata.resource_version.filter(|s| !s.is_empty()),
                continue_token: list.metadata.continue_.filter(|s| !s.is_empty()),
            })
        }
        Media::Protobuf => {
            let (kind, raw) = envelope(body)?;
            if kind != "PodList" {
                return Err(DecodeError::Kind {
                    kind,
                    expected: "PodList",
                });
            }
            let mut page = Page::default();
            for field in Fields(raw) {
                match field? {
                    (1, Field::Bytes(b)) => {
                        let m = pmeta::ListMeta::decode(b)?;
                        page.resource_version = m.resource_version.filter(|s| !s.is_empty());
                        page.continue_token = m.r#continue.filter(|s| !s.is_empty());
                    }
                    (2, Field::Bytes(b)) => {
                        let pod = k8s_pb::api::core::v1::Pod::decode(b)?;
                        page.items.push(CachedPod::from_protobuf(pod)?);
                    }
                    _ => {}
                }
            }
            Ok(page)
        }
    }
}

/// One watch frame (protobuf) or line (JSON).
pub fn decode_event(media: Media, frame: &[u8]) -> R<WatchItem> {
    match media {
        Media::Json => Ok(
            match serde_json::from_slice::<WatchEvent<CachedPod>>(frame)? {
                WatchEvent::Added(p) => WatchItem::Added(p),
                WatchEvent::Modified(p) => WatchItem::Modified(p),
                WatchEvent::Deleted(p) => WatchItem::Deleted(p),
                WatchEvent::Bookmark(b) => WatchItem::Bookmark {
                    initial_events_end: ends_initial(&b.metadata.annotations),
                    resource_version: b.metadata.resource_version,
                },
                WatchEvent::Error(s) => WatchItem::Error(s),
            },
        ),
        Media::Protobuf => {
            let mut type_ = None;
            let mut object: &[u8] = &[];
            for field in Fields(frame) {
                match field? {
                    (1, Field::Bytes(b)) => type_ = Some(utf8(b)?),
                    (2, Field::Bytes(ext)) => {
                        // RawExtension: field 1 is the object's bytes.
                        for f in Fields(ext) {
                            if let (1, Field::Bytes(raw)) = f? {
                                object = raw;
                            }
                        }
                    }
                    _ => {}
                }
            }
            let type_ = type_.unwrap_or_default();
            if type_ == "ERROR" {
                let (kind, raw) = envelope(object)?;
                if kind != "Status" {
                    return Err(DecodeError::Kind {
                        kind,
                        expected: "Status",
                    });
                }
                return Ok(WatchItem::Error(Box::new(status(pmeta::Status::decode(
                    raw,
                )?))));
            }
            let (kind, raw) = envelope(object)?;
            if kind != "Pod" {
                return Err(DecodeError::Kind {
                    kind,
                    expected: "Pod",
                });
            }
            let pod = k8s_pb::api::core::v1::Pod::decode(raw)?;
            match type_.as_str() {
                "ADDED" => Ok(WatchItem::Added(CachedPod::from_protobuf(pod)?)),
                "MODIFIED" => Ok(WatchItem::Modified(CachedPod::from_protobuf(pod)?)),
                "DELETED" => Ok(WatchItem::Deleted(CachedPod::from_protobuf(pod)?)),
                "BOOKMARK" => {
                    let m = pod.metadata.unwrap_or_default();
                    Ok(WatchItem::Bookmark {
                        initial_events_end: ends_initial(&m.annotations),
                        resource_version: m.resource_version.unwrap_or_default(),
                    })
                }
                _ => Err(DecodeError::EventType(type_)),
            }
        }
    }
}

/// An error response's body as a Status (`None`: not one).
pub fn decode_status(media: Media, body: &[u8]) -> Option<Status> {
    match media {
        Media::Json => serde_json::from_slice::<Status>(body).ok(),
        Media::Protobuf => {
            let (kind, raw) = envelope(body).ok()?;
            (kind == "Status")
                .then(|| pmeta::Status::decode(raw).ok().map(status))
                .flatten()
        }
    }
}

fn ends_initial(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(INITIAL_EVENTS_END)
        .is_some_and(|v| v == "true")
}

fn status(s: pmeta::Status) -> Status {
    Status {
        status: match s.status.as_deref() {
            Some("Success") => Some(StatusSummary::Success),
            Some("Failure") => Some(StatusSummary::Failure),
            _ => None,
        },
        code: s
            .code
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or_default(),
        message: s.message.unwrap_or_default(),
        reason: s.reason.unwrap_or_default(),
        metadata: None,
        details: None,
    }
}

fn utf8(b: &[u8]) -> R<String> {
    String::from_utf8(b.to_vec()).map_err(|e| DecodeError::Protobuf(e.to_string()))
}

/// The `k8s\0` + `runtime.Unknown` envelope: the object's kind and raw bytes (borrowed).
fn envelope(body: &[u8]) -> R<(String, &[u8])> {
    let rest = body.strip_prefix(MAGIC).ok_or(DecodeError::NoMagic)?;
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for field in Fields(rest) {
        match field? {
            (1, Field::Bytes(tm)) => {
                kind = k8s_pb::apimachinery::pkg::runtime::TypeMeta::decode(tm)?
                    .kind
                    .unwrap_or_default();
            }
            (2, Field::Bytes(b)) => raw = b,
            (3, Field::Bytes(enc)) if !enc.is_empty() => {
                return Err(DecodeError::ContentEncoding(utf8(enc)?));
            }
            _ => {}
        }
    }
    Ok((kind, raw))
}

/// A protobuf field's value (only length-delimited ones are read; the others are skipped).
enum Field<'a> {
    Bytes(&'a [u8]),
    Other,
}

/// The fields of a protobuf message, in order, borrowing its bytes.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = R<(u32, Field<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let r = self.field();
        if r.is_err() {
            // Nothing after a malformed field can be trusted.
            self.0 = &[];
        }
        Some(r)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> R<(u32, Field<'a>)> {
        let mut buf = self.0;
        let key = prost::encoding::decode_varint(&mut buf)?;
        let tag = u32::try_from(key >> 3).map_err(|_| bad("field number out of range"))?;
        let value = match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut buf)?;
                Field::Other
            }
            1 => {
                skip(&mut buf, 8)?;
                Field::Other
            }
            2 => {
                let len = usize::try_from(prost::encoding::decode_varint(&mut buf)?)
                    .map_err(|_| bad("length out of range"))?;
                if len > buf.remaining() {
                    return Err(bad("a length-delimited field runs past the end"));
                }
                let (value, rest) = buf.split_at(len);
                buf = rest;
                Field::Bytes(value)
            }
            5 => {
                skip(&mut buf, 4)?;
                Field::Other
            }
            w => return Err(DecodeError::Protobuf(format!("unsupported wire type {w}"))),
        };
        self.0 = buf;
        Ok((tag, value))
    }
}

fn skip(buf: &mut &[u8], n: usize) -> R<()> {
    if buf.len() < n {
        return Err(bad("a fixed-size field runs past the end"));
    }
    buf.advance(n);
    Ok(())
}

fn bad(what: &str) -> DecodeError {
    DecodeError::Protobuf(what.to_string())
}

/// Cuts a watch body into frames as its bytes arrive: 4-byte big-endian length prefixes
/// (protobuf) or lines (JSON).
pub struct Framer {
    media: Media,
    buf: BytesMut,
    /// JSON: bytes of `buf` already searched for a newline.
    scanned: usize,
}

impl Framer {
    pub fn new(media: Media) -> Self {
        Framer {
            media,
            buf: BytesMut::new(),
            scanned: 0,
        }
    }

    /// Adds bytes read from the body.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole frame, if its bytes are all there; an error for a frame over
    /// [`MAX_FRAME`] (the stream cannot be read past it).
    pub fn next_frame(&mut self) -> R<Option<BytesMut>> {
        match self.media {
            Media::Protobuf => {
                let Some(prefix) = self.buf.first_chunk::<4>() else {
                    return Ok(None);
                };
                let len = u32::from_be_bytes(*prefix) as usize;
                if len > MAX_FRAME {
                    return Err(DecodeError::Oversized(len));
                }
                if self.buf.len() < 4 + len {
                    return Ok(None);
                }
                self.buf.advance(4);
                Ok(Some(self.buf.split_to(len)))
            }
            Media::Json => loop {
                let from = self.scanned;
                let Some(end) = self.buf[from..].iter().position(|&b| b == b'\n') else {
                    self.scanned = self.buf.len();
                    if self.buf.len() > MAX_FRAME {
                        return Err(DecodeError::Oversized(self.buf.len()));
                    }
                    return Ok(None);
                };
                let end = from + end;
                self.scanned = 0;
                if end > MAX_FRAME {
                    return Err(DecodeError::Oversized(end));
                }
                let mut line = self.buf.split_to(end + 1);
                line.truncate(end);
                if line.iter().any(|b| !b.is_ascii_whitespace()) {
                    return Ok(Some(line));
                }
            },
        }
    }

    /// At the end of the body: an error if part of a frame is left.
    pub fn finish(&self) -> R<()> {
        let left = match self.media {
            Media::Protobuf => self.buf.len(),
            Media::Json => {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    0
                } else {
                    self.buf.len()
                }
            }
        };
        if left == 0 {
            Ok(())
        } else {
            Err(DecodeError::Truncated(left))
        }
    }
}
