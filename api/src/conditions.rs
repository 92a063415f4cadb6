//! Standard status conditions (`type`/`status`/`reason`/`message`/`lastTransitionTime`) for ebb resources.
//! `set_condition` keeps `lastTransitionTime` stable unless the status really changes.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The policy or resource is working as intended.
pub const READY: &str = "Ready";
/// A limit (parallelism, budget, group minimum) is holding deletions back.
pub const THROTTLED: &str = "Throttled";
/// Bad input or a conflict keeps the controller from acting on (part of) the resource.
pub const DEGRADED: &str = "Degraded";
/// The node agent's state store accepts writes.
pub const STORE_HEALTHY: &str = "StoreHealthy";
/// The node agent finished recovering its state after start.
pub const RECOVERED: &str = "Recovered";

/// Build a condition with `status` `"True"` or `"False"`.
pub fn condition(
    type_: &str,
    status: bool,
    reason: impl Into<String>,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: jiff::Timestamp,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.into(),
        message: message.into(),
        observed_generation,
        last_transition_time: Time(now),
    }
}

/// Insert or replace the condition of the same type. The previous `lastTransitionTime` is kept
/// when the status did not change, so that it tells when the state was entered.
/// Returns true when anything other than `lastTransitionTime` changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            let changed = old.status != new.status
                || old.reason != new.reason
                || old.message != new.message
                || old.observed_generation != new.observed_generation;
            *old = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// The condition of a type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of that type is present with status `"True"`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let mut cs = vec![];
        assert!(set_condition(
            &mut cs,
            condition(READY, true, "Ok", "fine", Some(1), at(10))
        ));
        assert!(!set_condition(
            &mut cs,
            condition(READY, true, "Ok", "fine", Some(1), at(20))
        ));
        assert_eq!(cs[0].last_transition_time.0, at(10));
        assert!(set_condition(
            &mut cs,
            condition(READY, true, "Ok", "other message", Some(1), at(30))
        ));
        assert_eq!(cs[0].last_transition_time.0, at(10));
        assert!(set_condition(
            &mut cs,
            condition(READY, false, "Bad", "broken", Some(1), at(40))
        ));
        assert_eq!(cs[0].last_transition_time.0, at(40));
        assert_eq!(cs.len(), 1);
        assert!(!is_true(&cs, READY));
        set_condition(&mut cs, condition(DEGRADED, true, "X", "y", None, at(50)));
        assert_eq!(cs.len(), 2);
        assert!(is_true(&cs, DEGRADED));
    }
}
