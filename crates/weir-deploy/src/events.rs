//! A deployment's events: each step the controller took and each failure, newest last, as
//! `kubectl describe` shows a FlinkDeployment's Kubernetes Events. `weir deployment events
//! NAME` prints them, and the operator's Web UI and `GET /deployments/{name}` show them, so
//! the reason of a rollback or a refused upgrade is found where the deployment is, not in a
//! failed cluster's log.

use serde::{Deserialize, Serialize};

/// How many events a deployment keeps (the oldest go first).
pub const EVENTS_KEPT: usize = 100;

/// One step or failure of a deployment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentEvent {
    /// When, in milliseconds since the epoch.
    pub time_ms: u64,
    /// `Normal` or `Warning`, as Kubernetes Events.
    #[serde(rename = "type")]
    pub kind: String,
    /// A CamelCase word (`OperationStarted`, `RollingBack`, `Refused`, ...).
    pub reason: String,
    /// What happened, in a sentence.
    pub message: String,
}

impl DeploymentEvent {
    /// An event at `time_ms`; `warning` for a failure.
    pub fn new(time_ms: u64, warning: bool, reason: &str, message: &str) -> DeploymentEvent {
        DeploymentEvent {
            time_ms,
            kind: if warning { "Warning" } else { "Normal" }.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
        }
    }
}

impl DeploymentEvent {
    /// An event now, by the wall clock (events are for people; the controller's decisions
    /// read its world's clock).
    pub fn now(warning: bool, reason: &str, message: &str) -> DeploymentEvent {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        DeploymentEvent::new(now, warning, reason, message)
    }
}

/// `events` with `event` appended, the oldest dropped past [`EVENTS_KEPT`].
pub fn appended(mut events: Vec<DeploymentEvent>, event: DeploymentEvent) -> Vec<DeploymentEvent> {
    events.push(event);
    let excess = events.len().saturating_sub(EVENTS_KEPT);
    events.drain(..excess);
    events
}

#[cfg(test)]
mod tests {
    use super::{DeploymentEvent, EVENTS_KEPT, appended};

    #[test]
    fn the_newest_events_are_kept_in_order() {
        let mut events = Vec::new();
        for i in 0..(EVENTS_KEPT as u64 + 5) {
            events = appended(events, DeploymentEvent::new(i, i % 2 == 0, "Step", &format!("step {i}")));
        }
        assert_eq!(events.len(), EVENTS_KEPT);
        assert_eq!(events[0].time_ms, 5);
        assert_eq!(events.last().map(|e| e.time_ms), Some(EVENTS_KEPT as u64 + 4));
        assert_eq!(events[1].kind, "Warning");
        let json = serde_json::to_value(&events[0]).unwrap();
        assert_eq!(json["type"], "Normal");
        assert_eq!(json["timeMs"], 5);
    }
}
