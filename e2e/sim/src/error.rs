//! API errors as the apiserver reports them: an HTTP code, a `reason` and a `Status` body.

use serde_json::{Value, json};

use crate::registry::ResourceInfo;

/// An error answer of the API server.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with(mut self, ri: &ResourceInfo, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": ri.group, "kind": ri.plural}));
        self
    }

    pub fn not_found(ri: &ResourceInfo, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", ri.qualified()),
        )
        .with(ri, name)
    }

    pub fn already_exists(ri: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", ri.qualified()),
        )
        .with(ri, name)
    }

    pub fn conflict(ri: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                ri.qualified()
            ),
        )
        .with(ri, name)
    }

    pub fn conflict_msg(ri: &ResourceInfo, name: &str, msg: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {msg}",
                ri.qualified()
            ),
        )
        .with(ri, name)
    }

    pub fn invalid(ri: &ResourceInfo, name: &str, causes: Vec<(String, String)>) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{}.{} \"{name}\" is invalid: {}",
                ri.kind,
                ri.group,
                text.join(", ")
            )
            .replace(". \"", " \""),
        )
        .with(ri, name);
        if let Some(d) = e.details.as_mut() {
            d["kind"] = json!(ri.kind);
            d["causes"] = causes
                .iter()
                .map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f}))
                .collect();
        }
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn not_found_path(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code});
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
