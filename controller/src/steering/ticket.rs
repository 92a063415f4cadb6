//! Steering tickets: an unguessable name for each destination the webhook hands out, carried by
//! the pod it was handed to, so the pod watch ties that destination to that pod and no other.

use std::fmt::Write;

/// Bytes of randomness in a ticket (128 bits: not guessable, not worth forging).
const TICKET_BYTES: usize = 16;

/// A fresh ticket (hex), or `None` when the system's random source fails (the pod is then not
/// steered: it fails open).
pub fn new() -> Option<String> {
    let mut bytes = [0u8; TICKET_BYTES];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(
            |e| tracing::error!(error = ?e, "no randomness for a steering ticket; not steering"),
        )
        .ok()?;
    let mut out = String::with_capacity(TICKET_BYTES * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tickets_are_long_hex_and_differ() {
        let a = super::new().unwrap_or_default();
        let b = super::new().unwrap_or_default();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }
}
