//! Saving the history to the PlacementHistory status and rebuilding it after a restart, per
//! Slider's rules. Only active flags, lastUsed times and the role map persist; counters do not.
//!
//! Encoding (schema version 1): one `NodeHistory` per node, its `entries` a comma-separated
//! list of `<roleId>:<seconds before savedAt>[:a]`, `:a` marking a role active at save time.

use std::collections::BTreeMap;

use ebb_api::conditions::Time;
use ebb_api::placement::{NodeHistory, PlacementHistorySpec, PlacementHistoryStatus, RoleStatus};
use jiff::{SignedDuration, Timestamp};

use super::error::HistoryError;
use super::history::{HistoryConfig, RoleHistory};
use super::node_map::{NodeEntry, NodeMap};
use super::roles::{RoleId, RoleTable};

/// Version of the status encoding written by [`RoleHistory::write_status`].
pub const SCHEMA_VERSION: i32 = 1;

/// What a rebuild found in the persisted status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Nothing was restored: no status yet, or it was discarded (see `discarded`).
    pub bootstrap: bool,
    /// Why a persisted history was ignored (it is overwritten at the next save).
    pub discarded: Option<String>,
    /// When the restored history was saved.
    pub saved_at: Option<Timestamp>,
    /// Nodes and entries restored.
    pub nodes: usize,
    pub entries: usize,
    /// Entries active at save time (given `lastUsed = savedAt`).
    pub active_at_save: usize,
    /// Persisted roles no longer in the spec, and how many entries were dropped with them.
    pub roles_dropped: Vec<String>,
    pub entries_dropped: usize,
    /// Entries older than `retention` at save time, not restored.
    pub purged: usize,
    /// Entries or role records that could not be read, skipped.
    pub malformed: usize,
}

impl RoleHistory {
    /// Rebuild from a persisted status (Slider's restart): entries active at save time get
    /// `lastUsed = savedAt`; entries of roles no longer in the spec are dropped and counted;
    /// entries unused for longer than `retention` before the save are purged; transient
    /// counters start at zero. Anything unreadable falls back to an empty history (reported,
    /// never an error). Afterwards replay live pods with [`RoleHistory::replay_pod`].
    /// Only an invalid spec is an error.
    pub fn rebuild(
        spec: &PlacementHistorySpec,
        status: Option<&PlacementHistoryStatus>,
        now: Timestamp,
    ) -> Result<(Self, RebuildReport), HistoryError> {
        let config = HistoryConfig::from_spec(spec)?;
        let mut report = RebuildReport::default();
        let persisted = status.filter(|s| s.saved_at.is_some() || !s.nodes.is_empty());
        let Some(status) = persisted else {
            report.bootstrap = true;
            return Self::empty(config, spec, now, report);
        };
        if let Some(why) = discard_reason(status) {
            tracing::warn!(reason = %why, "discarding persisted placement history; starting empty");
            report.bootstrap = true;
            report.discarded = Some(why);
            return Self::empty(config, spec, now, report);
        }
        let saved_at = status.saved_at.as_ref().map_or(now, |t| t.0);
        report.saved_at = Some(saved_at);

        let persisted_roles = PersistedRoles::read(status, &mut report);
        let roles = RoleTable::from_spec(spec, &persisted_roles.by_name)?;
        report.roles_dropped = persisted_roles
            .by_name
            .keys()
            .filter(|n| roles.by_name(n).is_none())
            .cloned()
            .collect();

        let cutoff = saved_at
            .saturating_sub(config.retention)
            .unwrap_or(Timestamp::MIN);
        let restore = Restore {
            ids: &persisted_roles.by_id,
            roles: &roles,
            saved_at,
            cutoff,
        };
        let nodes = restore.nodes(status, &mut report);
        report.nodes = nodes.len();
        report.log(saved_at);
        Ok((Self::from_parts(config, roles, nodes, now)?, report))
    }

    /// An empty history (nothing restored), with `report`.
    fn empty(
        config: HistoryConfig,
        spec: &PlacementHistorySpec,
        now: Timestamp,
        report: RebuildReport,
    ) -> Result<(Self, RebuildReport), HistoryError> {
        let roles = RoleTable::from_spec(spec, &BTreeMap::new())?;
        Ok((
            Self::from_parts(config, roles, NodeMap::default(), now)?,
            report,
        ))
    }

    /// Write the history into `status`: schema version, `savedAt` (whole seconds, as the API
    /// stores it), the role map with live figures, the per-node entries and the printer
    /// columns. Conditions and `observedGeneration` are left to the caller. Clears the dirty
    /// flag.
    pub fn write_status(&mut self, status: &mut PlacementHistoryStatus, now: Timestamp) {
        let saved_at = Timestamp::from_second(now.as_second()).unwrap_or(now);
        let requests = self.requests();
        let roles: Vec<RoleStatus> = self
            .roles()
            .iter()
            .map(|r| {
                let counters = self.counters_by_id(r.id);
                RoleStatus {
                    name: r.name.clone(),
                    id: to_i32(u64::from(r.id)),
                    live: to_i32(u64::from(self.live_of(r.id))),
                    gated: to_i32(requests.waiting_for_role(r.id) as u64),
                    pinned: to_i64(counters.pinned),
                    relaxed: to_i64(counters.relaxed),
                    anywhere: to_i64(counters.anywhere),
                }
            })
            .collect();
        let (bound, hits) = self.roles().iter().fold((0u64, 0u64), |(b, h), r| {
            let c = self.counters_by_id(r.id);
            (b + c.bound, h + c.hits)
        });
        let nodes: Vec<NodeHistory> = self
            .node_map()
            .iter()
            .filter_map(|(node, entries)| {
                let encoded = encode_entries(entries, saved_at);
                (!encoded.is_empty()).then(|| NodeHistory {
                    node: node.to_string(),
                    entries: encoded,
                })
            })
            .collect();
        status.schema_version = SCHEMA_VERSION;
        status.saved_at = Some(Time(saved_at));
        status.role_count = to_i32(roles.len() as u64);
        status.gated_pods = roles.iter().map(|r| r.gated).sum();
        status.roles = roles;
        status.node_count = to_i32(nodes.len() as u64);
        status.nodes = nodes;
        status.hit_rate = (bound > 0).then(|| format!("{}%", hits * 100 / bound));
        self.mark_saved();
    }
}

/// Why a persisted status cannot be read by this controller (it is then discarded).
fn discard_reason(status: &PlacementHistoryStatus) -> Option<String> {
    if status.schema_version != SCHEMA_VERSION {
        Some(format!(
            "status.schemaVersion is {} but this controller reads version {SCHEMA_VERSION}",
            status.schema_version
        ))
    } else if status.saved_at.is_none() {
        Some("status.savedAt is missing, so lastUsed times cannot be restored".to_string())
    } else {
        None
    }
}

/// The role map of a persisted status, both ways; duplicate or unreadable records are skipped
/// (counted as malformed).
struct PersistedRoles {
    by_name: BTreeMap<String, RoleId>,
    by_id: BTreeMap<RoleId, String>,
}

impl PersistedRoles {
    fn read(status: &PlacementHistoryStatus, report: &mut RebuildReport) -> Self {
        let mut by_name: BTreeMap<String, RoleId> = BTreeMap::new();
        let mut by_id: BTreeMap<RoleId, String> = BTreeMap::new();
        for role in &status.roles {
            let Ok(id) = RoleId::try_from(role.id) else {
                report.malformed += 1;
                continue;
            };
            if by_name.contains_key(&role.name) || by_id.contains_key(&id) {
                report.malformed += 1;
                continue;
            }
            by_name.insert(role.name.clone(), id);
            by_id.insert(id, role.name.clone());
        }
        Self { by_name, by_id }
    }
}

/// How persisted node entries are restored: role ids mapped to the spec's roles, `lastUsed`
/// counted back from `saved_at`, entries older than `cutoff` purged.
struct Restore<'a> {
    ids: &'a BTreeMap<RoleId, String>,
    roles: &'a RoleTable,
    saved_at: Timestamp,
    cutoff: Timestamp,
}

impl Restore<'_> {
    /// The node map of the persisted entries (counted in `report`).
    fn nodes(&self, status: &PlacementHistoryStatus, report: &mut RebuildReport) -> NodeMap {
        let mut nodes = NodeMap::default();
        for node in &status.nodes {
            for item in node.entries.split(',').filter(|s| !s.is_empty()) {
                let Some((role, last_used)) = self.entry(item, report) else {
                    continue;
                };
                let entry = nodes.get_or_create(&node.node, role);
                entry.last_used = entry.last_used.max(Some(last_used));
                report.entries += 1;
            }
        }
        nodes
    }

    /// One encoded entry as the role it belongs to and its `lastUsed`; `None` when it is
    /// malformed, of a dropped role, or purged (counted in `report`).
    fn entry(&self, item: &str, report: &mut RebuildReport) -> Option<(RoleId, Timestamp)> {
        let Some((id, ago, active)) = decode_entry(item) else {
            report.malformed += 1;
            return None;
        };
        let Some(name) = self.ids.get(&id) else {
            report.malformed += 1;
            return None;
        };
        let Some(role) = self.roles.by_name(name) else {
            report.entries_dropped += 1;
            return None;
        };
        let last_used = if active {
            report.active_at_save += 1;
            self.saved_at
        } else {
            self.saved_at
                .saturating_sub(SignedDuration::from_secs(ago))
                .unwrap_or(Timestamp::MIN)
        };
        if last_used < self.cutoff {
            report.purged += 1;
            return None;
        }
        Some((role.id, last_used))
    }
}

impl RebuildReport {
    fn log(&self, saved_at: Timestamp) {
        tracing::info!(
            nodes = self.nodes,
            entries = self.entries,
            active_at_save = self.active_at_save,
            roles_dropped = self.roles_dropped.len(),
            entries_dropped = self.entries_dropped,
            purged = self.purged,
            malformed = self.malformed,
            saved_at = %saved_at,
            "rebuilt placement history"
        );
    }
}

/// Encode one node's entries; entries neither active nor ever used are not persisted.
pub fn encode_entries(entries: &BTreeMap<RoleId, NodeEntry>, saved_at: Timestamp) -> String {
    let mut out = String::new();
    for (id, e) in entries {
        let active = e.active() > 0;
        let Some(ago) = (match e.last_used {
            Some(used) => Some(saved_at.duration_since(used).as_secs().max(0)),
            None if active => Some(0),
            None => None,
        }) else {
            continue;
        };
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&format!("{id}:{ago}"));
        if active {
            out.push_str(":a");
        }
    }
    out
}

/// Decode `<roleId>:<seconds>[:a]`.
pub fn decode_entry(item: &str) -> Option<(RoleId, i64, bool)> {
    let mut parts = item.split(':');
    let id = parts.next()?.parse().ok()?;
    let ago: i64 = parts.next()?.parse().ok()?;
    let active = match parts.next() {
        None => false,
        Some("a") => true,
        Some(_) => return None,
    };
    if parts.next().is_some() || ago < 0 {
        return None;
    }
    Some((id, ago, active))
}

fn to_i32(v: u64) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_reject_garbage() {
        assert_eq!(decode_entry("3:120:a"), Some((3, 120, true)));
        assert_eq!(decode_entry("0:7"), Some((0, 7, false)));
        for bad in ["", "x:1", "1", "1:-5", "1:2:b", "1:2:a:a"] {
            assert_eq!(decode_entry(bad), None, "{bad:?}");
        }
        let saved = Timestamp::from_second(1_000).unwrap();
        let entries = BTreeMap::from([
            (
                0,
                NodeEntry {
                    live: 1,
                    ..NodeEntry::default()
                },
            ),
            (
                2,
                NodeEntry {
                    last_used: Timestamp::from_second(900).ok(),
                    ..NodeEntry::default()
                },
            ),
            (5, NodeEntry::default()),
        ]);
        assert_eq!(encode_entries(&entries, saved), "0:0:a,2:100");
    }
}
