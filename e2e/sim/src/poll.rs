//! Waiting on a cluster from outside: polls a check every 50 ms until it gives a value or a
//! deadline passes, for the tests and tools that watch ebb-sim (or a real API server) settle.

use std::future::Future;
use std::time::Duration;

/// Polls `check` every 50 ms until it gives `Some`, failing after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
