//! Node-local API tokens: HMAC-SHA256 over pod UID, role and expiry, signed with the current or
//! previous master key (named by key id) and validated offline; rejections carry a reason.
//!
//! Format: `ebb1.<keyId>.<expiresUnixSeconds>.<podUid>.<hexMac>.<role>` (role last: it may
//! contain dots). The MAC covers `ebb1.<keyId>.<expires>.<podUid>.<role>`.

use std::collections::BTreeMap;

use hmac::Mac;

use crate::store::{MasterKey, Op, TokenState};

pub use ebb_api::token::hex;
use ebb_api::token::{VERSION, mac, payload};

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// What a valid token proves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub pod_uid: String,
    pub role: String,
    pub expires_at_secs: i64,
    pub key_id: String,
}

/// Why a token was refused (the 401 body names it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("no token: send it as `Authorization: Bearer <token>`")]
    Missing,
    #[error("malformed token")]
    Malformed,
    #[error("token signed with key {0:?}, which is neither the current nor the previous key")]
    UnknownKey(String),
    #[error("token signature does not match")]
    BadSignature,
    #[error("token expired at {0} (unix seconds)")]
    Expired(i64),
    #[error("the agent has no token key yet")]
    NoKeys,
}

/// Issues a token (the controller's side, shared through `ebb_api::token`; also used by tests
/// and operators' tooling).
pub fn issue(key: &MasterKey, pod_uid: &str, role: &str, expires_at_secs: i64) -> String {
    ebb_api::token::issue(&key.id, &key.secret, pod_uid, role, expires_at_secs)
}

/// The keys the agent validates with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keys {
    pub current: Option<MasterKey>,
    pub previous: Option<MasterKey>,
}

impl Keys {
    pub fn from_state(state: &TokenState) -> Keys {
        Keys {
            current: state.current.clone(),
            previous: state.previous.clone(),
        }
    }

    /// Validates a token offline at `now_secs`.
    pub fn validate(&self, token: &str, now_secs: i64) -> Result<Claims, Rejection> {
        if self.current.is_none() && self.previous.is_none() {
            return Err(Rejection::NoKeys);
        }
        let mut parts = token.trim().splitn(6, '.');
        let (Some(v), Some(key_id), Some(exp), Some(uid), Some(tag), Some(role)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(Rejection::Malformed);
        };
        if v != VERSION || uid.is_empty() || role.is_empty() {
            return Err(Rejection::Malformed);
        }
        let expires: i64 = exp.parse().map_err(|_| Rejection::Malformed)?;
        let tag = unhex(tag).ok_or(Rejection::Malformed)?;
        let key = [&self.current, &self.previous]
            .into_iter()
            .flatten()
            .find(|k| k.id == key_id)
            .ok_or_else(|| Rejection::UnknownKey(key_id.to_string()))?;
        mac(&key.secret, &payload(key_id, expires, uid, role))
            .verify_slice(&tag)
            .map_err(|_| Rejection::BadSignature)?;
        if expires <= now_secs {
            return Err(Rejection::Expired(expires));
        }
        Ok(Claims {
            pod_uid: uid.to_string(),
            role: role.to_string(),
            expires_at_secs: expires,
            key_id: key_id.to_string(),
        })
    }

    /// Brings the keys in line with the Secret's: returns the transitions to persist (none when
    /// nothing changed). A new current key pushes the old one to previous unless the Secret
    /// names a previous key itself.
    pub fn reconcile(&self, from_secret: &Keys) -> Vec<Op> {
        let mut ops = Vec::new();
        let Some(new_current) = &from_secret.current else {
            return ops;
        };
        let new_previous = match (&from_secret.previous, &self.current) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(old)) if old.id != new_current.id => Some(old.clone()),
            (None, _) => self.previous.clone(),
        };
        if let Some(p) = &new_previous
            && self.previous.as_ref() != Some(p)
        {
            ops.push(Op::PreviousMasterKey(p.clone()));
        }
        if self.current.as_ref() != Some(new_current) {
            ops.push(Op::CurrentMasterKey(new_current.clone()));
        }
        ops
    }

    /// Applies committed key transitions.
    pub fn apply(&mut self, ops: &[Op]) {
        for op in ops {
            match op {
                Op::CurrentMasterKey(k) => self.current = Some(k.clone()),
                Op::PreviousMasterKey(k) => self.previous = Some(k.clone()),
                _ => {}
            }
        }
    }
}

/// Secret data keys the controller writes (the previous pair is optional).
pub use ebb_api::token::{
    SECRET_CURRENT_ID, SECRET_CURRENT_KEY, SECRET_PREVIOUS_ID, SECRET_PREVIOUS_KEY,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("token key Secret lacks data key {0:?}")]
    MissingField(&'static str),
    #[error("token key Secret field {field:?} is invalid: {why}")]
    Invalid { field: &'static str, why: String },
}

fn key_from(
    data: &BTreeMap<String, Vec<u8>>,
    id_field: &'static str,
    key_field: &'static str,
) -> Result<Option<MasterKey>, SecretError> {
    let (Some(id), Some(secret)) = (data.get(id_field), data.get(key_field)) else {
        return match (data.contains_key(id_field), data.contains_key(key_field)) {
            (false, false) => Ok(None),
            (true, false) => Err(SecretError::MissingField(key_field)),
            _ => Err(SecretError::MissingField(id_field)),
        };
    };
    let id = String::from_utf8(id.clone()).map_err(|_| SecretError::Invalid {
        field: id_field,
        why: "not UTF-8".into(),
    })?;
    let id = id.trim().to_string();
    if id.is_empty() || id.contains('.') || id.len() > 64 {
        return Err(SecretError::Invalid {
            field: id_field,
            why: "key ids are 1-64 characters without dots".into(),
        });
    }
    if secret.len() < ebb_api::token::MIN_KEY_BYTES {
        return Err(SecretError::Invalid {
            field: key_field,
            why: format!("{} bytes; at least 32 are required", secret.len()),
        });
    }
    Ok(Some(MasterKey {
        id,
        secret: secret.clone(),
    }))
}

/// Reads the keys out of the Secret's data.
pub fn keys_from_secret(data: &BTreeMap<String, Vec<u8>>) -> Result<Keys, SecretError> {
    let current = key_from(data, SECRET_CURRENT_ID, SECRET_CURRENT_KEY)?
        .ok_or(SecretError::MissingField(SECRET_CURRENT_ID))?;
    let previous = key_from(data, SECRET_PREVIOUS_ID, SECRET_PREVIOUS_KEY)?;
    Ok(Keys {
        current: Some(current),
        previous,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(id: &str, b: u8) -> MasterKey {
        MasterKey {
            id: id.into(),
            secret: vec![b; 32],
        }
    }

    fn rotate(keys: &mut Keys, next: MasterKey) {
        let ops = keys.reconcile(&Keys {
            current: Some(next),
            previous: None,
        });
        keys.apply(&ops);
    }

    #[test]
    fn valid_expired_wrong_key_previous_key_and_rotated_twice() {
        let mut keys = Keys {
            current: Some(k("k1", 1)),
            previous: None,
        };
        let token = issue(&k("k1", 1), "uid-1", "region.server", 1_000);
        let claims = keys.validate(&token, 999).unwrap();
        assert_eq!(claims.pod_uid, "uid-1");
        assert_eq!(claims.role, "region.server");
        assert_eq!(claims.key_id, "k1");

        assert_eq!(keys.validate(&token, 1_000), Err(Rejection::Expired(1_000)));

        // same key id, different material: the signature does not match
        let forged = issue(&k("k1", 9), "uid-1", "region.server", 1_000);
        assert_eq!(keys.validate(&forged, 10), Err(Rejection::BadSignature));
        // a tampered claim breaks the signature too
        let tampered = token.replace("uid-1", "uid-2");
        assert_eq!(keys.validate(&tampered, 10), Err(Rejection::BadSignature));
        let other = issue(&k("zz", 1), "uid-1", "r", 1_000);
        assert_eq!(
            keys.validate(&other, 10),
            Err(Rejection::UnknownKey("zz".into()))
        );

        rotate(&mut keys, k("k2", 2));
        assert_eq!(keys.previous.as_ref().unwrap().id, "k1");
        assert!(
            keys.validate(&token, 10).is_ok(),
            "previous key still valid"
        );
        let new_token = issue(&k("k2", 2), "uid-1", "r", 1_000);
        assert!(keys.validate(&new_token, 10).is_ok());

        rotate(&mut keys, k("k3", 3));
        assert_eq!(
            keys.validate(&token, 10),
            Err(Rejection::UnknownKey("k1".into())),
            "rotated twice: the first key is gone"
        );
        assert!(keys.validate(&new_token, 10).is_ok());
        assert!(rotate_is_idempotent(&keys));
    }

    fn rotate_is_idempotent(keys: &Keys) -> bool {
        keys.reconcile(&Keys {
            current: keys.current.clone(),
            previous: None,
        })
        .is_empty()
    }

    #[test]
    fn malformed_and_missing_keys_are_rejected() {
        let keys = Keys {
            current: Some(k("k1", 1)),
            previous: None,
        };
        for bad in [
            "",
            "ebb1.k1",
            "ebb2.k1.5.u.00.r",
            "ebb1.k1.x.u.00.r",
            "ebb1.k1.5.u.zz.r",
        ] {
            assert_eq!(keys.validate(bad, 0), Err(Rejection::Malformed), "{bad:?}");
        }
        assert_eq!(Keys::default().validate("x", 0), Err(Rejection::NoKeys));
    }

    #[test]
    fn keys_come_from_secret_data() {
        let mut data = BTreeMap::new();
        data.insert(SECRET_CURRENT_ID.to_string(), b"k2".to_vec());
        data.insert(SECRET_CURRENT_KEY.to_string(), vec![2; 32]);
        let keys = keys_from_secret(&data).unwrap();
        assert_eq!(keys.current, Some(k("k2", 2)));
        assert_eq!(keys.previous, None);
        data.insert(SECRET_PREVIOUS_ID.to_string(), b"k1".to_vec());
        assert_eq!(
            keys_from_secret(&data),
            Err(SecretError::MissingField(SECRET_PREVIOUS_KEY))
        );
        data.insert(SECRET_PREVIOUS_KEY.to_string(), vec![1; 8]);
        let err = keys_from_secret(&data).unwrap_err();
        assert!(err.to_string().contains("at least 32"), "{err}");
        data.insert(SECRET_PREVIOUS_KEY.to_string(), vec![1; 32]);
        assert_eq!(keys_from_secret(&data).unwrap().previous, Some(k("k1", 1)));
        assert_eq!(
            keys_from_secret(&BTreeMap::new()),
            Err(SecretError::MissingField(SECRET_CURRENT_ID))
        );
    }
}
