//! The token master-key Secret the controller owns: created when missing, rotated on an
//! interval (current becomes previous), and the current key used to mint pod tokens.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ebb_api::names::FIELD_MANAGER_CONTROLLER;
use ebb_api::token;
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};

/// Annotation on the Secret: when its current key was made (RFC 3339).
const ROTATED_AT: &str = "ebb.dev/rotated-at";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading random bytes for a token key from /dev/urandom: {0}")]
    Random(#[from] std::io::Error),
    #[error("reading or writing the token key Secret {secret}: {source}")]
    Api {
        secret: String,
        #[source]
        source: kube::Error,
    },
}

/// A master key.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    pub id: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The current key, shared with the placement loop (`None` until the Secret was read).
#[derive(Clone, Default)]
pub struct CurrentKey(Arc<RwLock<Option<Key>>>);

impl CurrentKey {
    pub fn get(&self) -> Option<Key> {
        self.0
            .read()
            .map(|k| k.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
    /// A current key already known (tests).
    #[cfg(test)]
    pub fn known(key: Key) -> Self {
        let k = Self::default();
        k.set(key);
        k
    }
    fn set(&self, key: Key) {
        match self.0.write() {
            Ok(mut k) => *k = Some(key),
            Err(p) => *p.into_inner() = Some(key),
        }
    }
    /// A token for a pod, valid for `ttl` from `now`; `None` while no key is known.
    pub fn mint(&self, pod_uid: &str, role: &str, now: Timestamp, ttl: Duration) -> Option<String> {
        let key = self.get()?;
        let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
        Some(token::issue(
            &key.id,
            &key.secret,
            pod_uid,
            role,
            now.as_second().saturating_add(ttl),
        ))
    }
}

fn random_key(now: Timestamp) -> Result<Key, KeyError> {
    use std::io::Read;
    let mut secret = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
    Ok(Key {
        id: format!("k{}", now.as_second()),
        secret,
    })
}

fn key_of(data: &BTreeMap<String, ByteString>, id: &str, key: &str) -> Option<Key> {
    let id = String::from_utf8(data.get(id)?.0.clone()).ok()?;
    let secret = data.get(key)?.0.clone();
    (!id.is_empty() && !id.contains('.') && secret.len() >= token::MIN_KEY_BYTES).then(|| Key {
        id: id.trim().to_string(),
        secret,
    })
}

/// The Secret's current key and when it was made, if readable.
fn read(secret: &Secret) -> Option<(Key, Option<Timestamp>)> {
    let data = secret.data.as_ref()?;
    let key = key_of(data, token::SECRET_CURRENT_ID, token::SECRET_CURRENT_KEY)?;
    let at = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROTATED_AT))
        .and_then(|s| s.parse().ok());
    Some((key, at))
}

/// Due for rotation: no readable key, or the key is older than `every`.
pub fn due(made: Option<Timestamp>, now: Timestamp, every: Duration) -> bool {
    let every = jiff::SignedDuration::try_from(every).unwrap_or(jiff::SignedDuration::MAX);
    made.is_none_or(|m| now.duration_since(m) >= every)
}

/// Keeps the Secret `namespace/name` current: reads it, creates or rotates it when due, and
/// publishes the current key.
pub struct KeyKeeper {
    api: Api<Secret>,
    name: String,
    namespace: String,
    pub current: CurrentKey,
}

impl KeyKeeper {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            namespace: namespace.to_string(),
            current: CurrentKey::default(),
        }
    }

    fn err(&self, source: kube::Error) -> KeyError {
        KeyError::Api {
            secret: format!("{}/{}", self.namespace, self.name),
            source,
        }
    }

    /// One check: rotate when due (or create), else adopt the Secret's key.
    pub async fn tick(&self, every: Duration) -> Result<(), KeyError> {
        let now = Timestamp::now();
        let existing = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err(e))?;
        let read = existing.as_ref().and_then(read);
        if let Some((key, made)) = &read
            && !due(*made, now, every)
        {
            self.current.set(key.clone());
            return Ok(());
        }
        let next = random_key(now)?;
        let mut data = BTreeMap::new();
        data.insert(
            token::SECRET_CURRENT_ID.to_string(),
            ByteString(next.id.clone().into_bytes()),
        );
        data.insert(
            token::SECRET_CURRENT_KEY.to_string(),
            ByteString(next.secret.clone()),
        );
        if let Some((old, _)) = &read {
            data.insert(
                token::SECRET_PREVIOUS_ID.to_string(),
                ByteString(old.id.clone().into_bytes()),
            );
            data.insert(
                token::SECRET_PREVIOUS_KEY.to_string(),
                ByteString(old.secret.clone()),
            );
        }
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "annotations": {ROTATED_AT: now.to_string()},
            },
            "type": "Opaque",
            "data": data,
        });
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|e| self.err(e))?;
        tracing::info!(secret = %self.name, key = %next.id, rotated = read.is_some(), "token key written");
        self.current.set(next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_is_due_when_missing_or_old() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let hour = Duration::from_secs(3600);
        assert!(due(None, now, hour));
        assert!(!due(
            Some("2026-01-01T11:00:01Z".parse().unwrap()),
            now,
            hour
        ));
        assert!(due(
            Some("2026-01-01T11:00:00Z".parse().unwrap()),
            now,
            hour
        ));
    }

    #[test]
    fn secret_data_round_trips_and_short_keys_are_refused() {
        let mut data = BTreeMap::new();
        data.insert("current.id".to_string(), ByteString(b"k1".to_vec()));
        data.insert("current.key".to_string(), ByteString(vec![1; 32]));
        let s = Secret {
            data: Some(data.clone()),
            ..Secret::default()
        };
        assert_eq!(read(&s).unwrap().0.id, "k1");
        data.insert("current.key".to_string(), ByteString(vec![1; 31]));
        let s = Secret {
            data: Some(data),
            ..Secret::default()
        };
        assert!(read(&s).is_none());
    }

    #[test]
    fn minted_tokens_carry_the_key_id_and_expiry() {
        let k = CurrentKey::default();
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert!(k.mint("u", "r", now, Duration::from_secs(60)).is_none());
        k.set(Key {
            id: "k9".into(),
            secret: vec![3; 32],
        });
        let t = k.mint("u", "r", now, Duration::from_secs(60)).unwrap();
        assert!(
            t.starts_with(&format!("ebb1.k9.{}.u.", now.as_second() + 60)),
            "{t}"
        );
    }
}
