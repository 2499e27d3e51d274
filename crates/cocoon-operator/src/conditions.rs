//! `metav1.Condition` bookkeeping with the API machinery's "set status condition" semantics:
//! `lastTransitionTime` moves only when the status flips, unless a caller forces it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The condition to record; timestamps are filled in by [`set_condition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCondition<'a> {
    pub type_: &'a str,
    pub status: &'a str,
    pub reason: &'a str,
    pub message: String,
    pub observed_generation: i64,
}

/// Merges `new` into `conditions`. An existing condition of the same type keeps its
/// `lastTransitionTime` unless its status changes or `force_transition` is set; a new one gets
/// `now`. Returns true when anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    new: NewCondition<'_>,
    now: Timestamp,
    force_transition: bool,
) -> bool {
    let observed = (new.observed_generation != 0).then_some(new.observed_generation);
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            let before = existing.clone();
            if existing.status != new.status || force_transition {
                existing.last_transition_time = Time(now);
            }
            existing.status = new.status.to_string();
            existing.reason = new.reason.to_string();
            existing.message = new.message;
            existing.observed_generation = observed;
            *existing != before
        }
        None => {
            conditions.push(Condition {
                type_: new.type_.to_string(),
                status: new.status.to_string(),
                reason: new.reason.to_string(),
                message: new.message,
                observed_generation: observed,
                last_transition_time: Time(now),
            });
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("time")
    }

    fn ready(status: &'static str, msg: &str) -> NewCondition<'static> {
        NewCondition {
            type_: "Ready",
            status,
            reason: "Pending",
            message: msg.to_string(),
            observed_generation: 2,
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_flips_or_forced() {
        let mut c = Vec::new();
        assert!(set_condition(&mut c, ready("False", "a"), at(0), false));
        assert_eq!(c[0].last_transition_time.0, at(0));
        // False -> False keeps the timestamp, even with a new message.
        assert!(set_condition(&mut c, ready("False", "b"), at(10), false));
        assert_eq!(c[0].last_transition_time.0, at(0));
        assert_eq!(c[0].message, "b");
        // Same content: nothing changes.
        assert!(!set_condition(&mut c, ready("False", "b"), at(20), false));
        // Forced: the timestamp moves on a False -> False change.
        assert!(set_condition(&mut c, ready("False", "b"), at(30), true));
        assert_eq!(c[0].last_transition_time.0, at(30));
        // A flip moves it.
        assert!(set_condition(&mut c, ready("True", "b"), at(40), false));
        assert_eq!(c[0].last_transition_time.0, at(40));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].observed_generation, Some(2));
    }
}
