//! Node-local API token format shared by the controller (which mints tokens) and the node agent
//! (which validates them): HMAC-SHA256 over version, key id, expiry, pod UID and role.
//!
//! Format: `ebb1.<keyId>.<expiresUnixSeconds>.<podUid>.<hexMac>.<role>` (role last: it may
//! contain dots). The MAC covers `ebb1.<keyId>.<expires>.<podUid>.<role>`.
//!
//! The keys live in a Secret owned by the controller with the data keys `current.id`,
//! `current.key`, `previous.id` and `previous.key` (the previous pair is optional; key ids are
//! 1-64 characters without dots, keys at least [`MIN_KEY_BYTES`] bytes).

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// First field of every token.
pub const VERSION: &str = "ebb1";
/// Shortest accepted master key.
pub const MIN_KEY_BYTES: usize = 32;
/// Secret data keys.
pub const SECRET_CURRENT_ID: &str = "current.id";
pub const SECRET_CURRENT_KEY: &str = "current.key";
pub const SECRET_PREVIOUS_ID: &str = "previous.id";
pub const SECRET_PREVIOUS_KEY: &str = "previous.key";

/// The HMAC of `payload` under `secret`.
pub fn mac(secret: &[u8], payload: &str) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|e| unreachable!("HMAC takes any key length: {e}"));
    m.update(payload.as_bytes());
    m
}

/// The signed part of a token.
pub fn payload(key_id: &str, expires: i64, pod_uid: &str, role: &str) -> String {
    format!("{VERSION}.{key_id}.{expires}.{pod_uid}.{role}")
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Mint a token for a pod with the key `key_id`/`secret`, valid until `expires_at_secs`.
pub fn issue(
    key_id: &str,
    secret: &[u8],
    pod_uid: &str,
    role: &str,
    expires_at_secs: i64,
) -> String {
    let p = payload(key_id, expires_at_secs, pod_uid, role);
    let tag = hex(&mac(secret, &p).finalize().into_bytes());
    format!("{VERSION}.{key_id}.{expires_at_secs}.{pod_uid}.{tag}.{role}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_fields_and_known_mac() {
        let t = issue("k1", &[7u8; 32], "uid-1", "region.server", 1_000);
        let parts: Vec<&str> = t.splitn(6, '.').collect();
        assert_eq!(parts[..4], ["ebb1", "k1", "1000", "uid-1"]);
        assert_eq!(parts[5], "region.server");
        assert_eq!(parts[4].len(), 64);
        // RFC 4231 test case 2: HMAC-SHA256("Jefe", "what do ya want for nothing?").
        let m = mac(b"Jefe", "what do ya want for nothing?");
        assert_eq!(
            hex(&m.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
