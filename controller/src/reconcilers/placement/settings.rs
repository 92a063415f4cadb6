//! Settings of placement (flags of `ebb-controller run`) and their defaults, written once here
//! for both [`PlacementSettings::default`] and the command line.

use std::time::Duration;

/// Settings of placement (flags of `ebb-controller run`).
#[derive(Clone, Debug)]
pub struct PlacementSettings {
    /// Gated pods no valid PlacementHistory governs are released after this.
    pub grace: Duration,
    /// Status writes per PlacementHistory at most this often.
    pub status_interval: Duration,
    /// Waiting pods are looked at again this often.
    pub retry: Duration,
    /// Tokens minted for pods are valid this long.
    pub token_ttl: Duration,
    /// The token key is replaced this often (the old one stays valid as the previous key).
    pub key_rotation: Duration,
    /// `namespace/name` of the token key Secret.
    pub token_secret: (String, String),
}

impl PlacementSettings {
    /// Default of [`PlacementSettings::grace`] (`--placement-grace`).
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
    /// Default of [`PlacementSettings::status_interval`] (`--placement-status-interval`).
    pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(10);
    /// Default of [`PlacementSettings::retry`] (no flag).
    pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);
    /// Default of [`PlacementSettings::token_ttl`] (`--token-ttl`).
    pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
    /// Default of [`PlacementSettings::key_rotation`] (`--token-rotation`).
    pub const DEFAULT_KEY_ROTATION: Duration = Duration::from_secs(24 * 3600);
    /// Default namespace of the token key Secret (`--namespace`, the controller's own).
    pub const DEFAULT_TOKEN_SECRET_NAMESPACE: &str = "ebb-system";
    /// Default name of the token key Secret (`--token-secret`).
    pub const DEFAULT_TOKEN_SECRET_NAME: &str = "ebb-token-keys";
}

impl Default for PlacementSettings {
    fn default() -> Self {
        Self {
            grace: Self::DEFAULT_GRACE,
            status_interval: Self::DEFAULT_STATUS_INTERVAL,
            retry: Self::DEFAULT_RETRY,
            token_ttl: Self::DEFAULT_TOKEN_TTL,
            key_rotation: Self::DEFAULT_KEY_ROTATION,
            token_secret: (
                Self::DEFAULT_TOKEN_SECRET_NAMESPACE.into(),
                Self::DEFAULT_TOKEN_SECRET_NAME.into(),
            ),
        }
    }
}
