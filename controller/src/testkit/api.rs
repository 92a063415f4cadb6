//! Answers of a fake API server, for tests of code that calls one: a JSON body with its status
//! code, and the `Status` object the API server sends with an error.

use axum::http::Response;
use kube::client::Body;
use serde_json::{Value, json};

/// An answer with `code` and the JSON `body`.
pub fn json_response(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .expect("a test's status code is valid")
}

/// The API server's `Status` of a failed request.
pub fn failure(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": reason, "code": code, "message": message})
}
