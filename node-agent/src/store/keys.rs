//! Key layout of the state store: readable, `/`-separated keys with a subsystem database each.
//! Encoding and parsing live here so every backend (and `dump`) agrees on one layout.
//!
//! | database       | key                                                        | value              |
//! |----------------|------------------------------------------------------------|--------------------|
//! | `meta`         | `schema-version`                                           | `major.minor` text |
//! | `containers`   | `<podUid>/<container>/requested`                           | `ContainerRequest` |
//! |                | `<podUid>/<container>/launched`                            | start time         |
//! |                | `<podUid>/<container>/killed`                              | `KillRecord`       |
//! |                | `<podUid>/<container>/completed`                           | `Completion`       |
//! |                | `<podUid>/<container>/restarts`                            | restart count      |
//! |                | `<podUid>/<container>/diagnostics`                         | message            |
//! | `localization` | `public/{started,completed}/<path>`                        | request / record   |
//! |                | `namespace/<ns>/{started,completed}/<path>`                | request / record   |
//! |                | `application/<ns>/<placementHistory>/{started,completed}/<path>` | request / record |
//! | `applications` | `<ns>/<placementHistory>/init`                             | uid, init time     |
//! |                | `<ns>/<placementHistory>/finished`                         | finish time        |
//! | `tokens`       | `master/current`, `master/previous`                        | `MasterKey`        |
//! |                | `container/<podUid>`                                       | `TokenRecord`      |
//! | `deletion`     | `task/<id, 20 digits>`                                     | `DeletionTask`     |

use super::records::{AppId, CacheScope, ContainerId};

pub const DB_META: &str = "meta";
pub const DB_CONTAINERS: &str = "containers";
pub const DB_LOCALIZATION: &str = "localization";
pub const DB_APPLICATIONS: &str = "applications";
pub const DB_TOKENS: &str = "tokens";
pub const DB_DELETION: &str = "deletion";
/// Every database, in recovery order after `meta`.
pub const ALL_DBS: [&str; 6] = [
    DB_META,
    DB_LOCALIZATION,
    DB_APPLICATIONS,
    DB_CONTAINERS,
    DB_TOKENS,
    DB_DELETION,
];

pub const META_SCHEMA_VERSION: &str = "schema-version";
pub const TOKENS_CURRENT: &str = "master/current";
pub const TOKENS_PREVIOUS: &str = "master/previous";
pub const TOKENS_CONTAINER_PREFIX: &str = "container/";
pub const DELETION_PREFIX: &str = "task/";

/// The per-container fields, each under its own key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerField {
    Requested,
    Launched,
    Killed,
    Completed,
    Restarts,
    Diagnostics,
}

impl ContainerField {
    pub const ALL: [ContainerField; 6] = [
        ContainerField::Requested,
        ContainerField::Launched,
        ContainerField::Killed,
        ContainerField::Completed,
        ContainerField::Restarts,
        ContainerField::Diagnostics,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ContainerField::Requested => "requested",
            ContainerField::Launched => "launched",
            ContainerField::Killed => "killed",
            ContainerField::Completed => "completed",
            ContainerField::Restarts => "restarts",
            ContainerField::Diagnostics => "diagnostics",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

pub fn container(id: &ContainerId, field: ContainerField) -> String {
    format!("{}/{}/{}", id.pod_uid, id.container, field.as_str())
}

/// Parses a `containers` key; `None` for a key that does not follow the layout.
pub fn parse_container(key: &str) -> Option<(ContainerId, ContainerField)> {
    let mut parts = key.splitn(3, '/');
    let uid = parts.next()?;
    let name = parts.next()?;
    let field = ContainerField::parse(parts.next()?)?;
    if uid.is_empty() || name.is_empty() {
        return None;
    }
    Some((ContainerId::new(uid, name), field))
}

/// Whether a localization key is for a fetch that began or one that finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalizationPhase {
    Started,
    Completed,
}

impl LocalizationPhase {
    fn as_str(self) -> &'static str {
        match self {
            LocalizationPhase::Started => "started",
            LocalizationPhase::Completed => "completed",
        }
    }
}

pub fn localization(scope: &CacheScope, phase: LocalizationPhase, local_path: &str) -> String {
    let phase = phase.as_str();
    match scope {
        CacheScope::Public => format!("public/{phase}/{local_path}"),
        CacheScope::Namespace { namespace } => {
            format!("namespace/{namespace}/{phase}/{local_path}")
        }
        CacheScope::Application {
            namespace,
            placement_history,
        } => format!("application/{namespace}/{placement_history}/{phase}/{local_path}"),
    }
}

/// Parses a `localization` key into scope, phase and local path.
pub fn parse_localization(key: &str) -> Option<(CacheScope, LocalizationPhase, String)> {
    let (kind, rest) = key.split_once('/')?;
    let (scope, rest) = match kind {
        "public" => (CacheScope::Public, rest),
        "namespace" => {
            let (ns, rest) = rest.split_once('/')?;
            (
                CacheScope::Namespace {
                    namespace: ns.to_string(),
                },
                rest,
            )
        }
        "application" => {
            let (ns, rest) = rest.split_once('/')?;
            let (ph, rest) = rest.split_once('/')?;
            (
                CacheScope::Application {
                    namespace: ns.to_string(),
                    placement_history: ph.to_string(),
                },
                rest,
            )
        }
        _ => return None,
    };
    let (phase, path) = rest.split_once('/')?;
    let phase = match phase {
        "started" => LocalizationPhase::Started,
        "completed" => LocalizationPhase::Completed,
        _ => return None,
    };
    if path.is_empty() {
        return None;
    }
    Some((scope, phase, path.to_string()))
}

/// Application keys: `init` (uid and first-seen time) and `finished` (finish time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppField {
    Init,
    Finished,
}

pub fn application(app: &AppId, field: AppField) -> String {
    let field = match field {
        AppField::Init => "init",
        AppField::Finished => "finished",
    };
    format!("{}/{}/{field}", app.namespace, app.placement_history)
}

pub fn parse_application(key: &str) -> Option<(AppId, AppField)> {
    let mut parts = key.splitn(3, '/');
    let ns = parts.next()?;
    let ph = parts.next()?;
    let field = match parts.next()? {
        "init" => AppField::Init,
        "finished" => AppField::Finished,
        _ => return None,
    };
    (!ns.is_empty() && !ph.is_empty()).then(|| (AppId::new(ns, ph), field))
}

pub fn container_token(pod_uid: &str) -> String {
    format!("{TOKENS_CONTAINER_PREFIX}{pod_uid}")
}

pub fn deletion_task(id: u64) -> String {
    format!("{DELETION_PREFIX}{id:020}")
}

pub fn parse_deletion_task(key: &str) -> Option<u64> {
    key.strip_prefix(DELETION_PREFIX)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localization_keys_round_trip_for_every_scope() {
        let scopes = [
            CacheScope::Public,
            CacheScope::Namespace {
                namespace: "team-a".into(),
            },
            CacheScope::Application {
                namespace: "team-a".into(),
                placement_history: "hbase".into(),
            },
        ];
        for scope in scopes {
            for phase in [LocalizationPhase::Started, LocalizationPhase::Completed] {
                let key = localization(&scope, phase, "public/ab/cd/model.bin");
                let parsed = parse_localization(&key);
                assert_eq!(
                    parsed,
                    Some((scope.clone(), phase, "public/ab/cd/model.bin".to_string())),
                    "{key}"
                );
            }
        }
        assert_eq!(
            localization(&CacheScope::Public, LocalizationPhase::Started, "x/y"),
            "public/started/x/y"
        );
        assert_eq!(parse_localization("public/halfway/x"), None);
        assert_eq!(parse_localization("elsewhere/started/x"), None);
    }

    #[test]
    fn container_and_deletion_keys_round_trip() {
        let id = ContainerId::new("7f0c-uid", "web");
        assert_eq!(
            container(&id, ContainerField::Killed),
            "7f0c-uid/web/killed"
        );
        assert_eq!(
            parse_container("7f0c-uid/web/completed"),
            Some((id, ContainerField::Completed))
        );
        assert_eq!(parse_container("7f0c-uid/web/unknown"), None);
        assert_eq!(deletion_task(42), "task/00000000000000000042");
        assert_eq!(parse_deletion_task("task/00000000000000000042"), Some(42));
        // zero padding keeps numeric and key order the same
        assert!(deletion_task(9) < deletion_task(10));
        let app = AppId::new("ns", "ph");
        assert_eq!(application(&app, AppField::Finished), "ns/ph/finished");
        assert_eq!(parse_application("ns/ph/init"), Some((app, AppField::Init)));
        assert_eq!(parse_application("ns/ph"), None);
    }
}
