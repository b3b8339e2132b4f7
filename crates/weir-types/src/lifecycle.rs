//! Job and subtask lifecycle state machines with Flink's states and legal transitions.
//!
//! Every transition is checked against the table of legal moves and recorded with its
//! wall-clock time, so REST, the CLI and the Web UI can show when each state was entered.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A state machine whose legal moves are known.
pub trait Lifecycle: Copy + Eq + fmt::Debug + fmt::Display {
    /// True when `self -> next` is a legal transition.
    fn can_transition_to(self, next: Self) -> bool;
    /// True when no transition may leave this state.
    fn is_terminal(self) -> bool;
    /// Every state, in declaration order (for per-state timestamp tables).
    fn all() -> &'static [Self];
}

/// A job's state, as Flink's `JobStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(missing_docs)]
pub enum JobStatus {
    Initializing,
    Created,
    Running,
    Failing,
    Failed,
    Cancelling,
    Canceled,
    Finished,
    Restarting,
    Suspended,
    Reconciling,
}

impl JobStatus {
    /// FAILED, CANCELED and FINISHED: the job will never run again in this cluster.
    pub fn is_globally_terminal(self) -> bool {
        matches!(self, JobStatus::Failed | JobStatus::Canceled | JobStatus::Finished)
    }

    /// The upper-case name users see (`RUNNING`, `FAILED` ...).
    pub fn name(self) -> &'static str {
        match self {
            JobStatus::Initializing => "INITIALIZING",
            JobStatus::Created => "CREATED",
            JobStatus::Running => "RUNNING",
            JobStatus::Failing => "FAILING",
            JobStatus::Failed => "FAILED",
            JobStatus::Cancelling => "CANCELLING",
            JobStatus::Canceled => "CANCELED",
            JobStatus::Finished => "FINISHED",
            JobStatus::Restarting => "RESTARTING",
            JobStatus::Suspended => "SUSPENDED",
            JobStatus::Reconciling => "RECONCILING",
        }
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Lifecycle for JobStatus {
    fn can_transition_to(self, next: JobStatus) -> bool {
        use JobStatus::*;
        if self.is_terminal() {
            return false;
        }
        // Any live job may be suspended (lost leadership, cluster shutdown).
        if next == Suspended {
            return true;
        }
        match self {
            Initializing => matches!(next, Created | Failed | Canceled),
            Created => matches!(next, Running | Failing | Failed | Cancelling | Canceled | Reconciling),
            Running => matches!(next, Finished | Failing | Cancelling | Restarting),
            Failing => matches!(next, Failed | Restarting | Canceled),
            Cancelling => matches!(next, Canceled),
            Restarting => matches!(next, Created | Running | Failing | Failed | Cancelling | Canceled),
            Reconciling => matches!(next, Running | Failing | Failed | Cancelling | Finished | Restarting),
            Failed | Canceled | Finished | Suspended => false,
        }
    }

    fn is_terminal(self) -> bool {
        self.is_globally_terminal() || self == JobStatus::Suspended
    }

    fn all() -> &'static [JobStatus] {
        use JobStatus::*;
        &[
            Initializing,
            Created,
            Running,
            Failing,
            Failed,
            Cancelling,
            Canceled,
            Finished,
            Restarting,
            Suspended,
            Reconciling,
        ]
    }
}

/// A subtask attempt's state, as Flink's `ExecutionState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(missing_docs)]
pub enum ExecutionState {
    Created,
    Scheduled,
    Deploying,
    Initializing,
    Running,
    Finished,
    Canceling,
    Canceled,
    Failed,
    Reconciling,
}

impl ExecutionState {
    /// The upper-case name users see.
    pub fn name(self) -> &'static str {
        match self {
            ExecutionState::Created => "CREATED",
            ExecutionState::Scheduled => "SCHEDULED",
            ExecutionState::Deploying => "DEPLOYING",
            ExecutionState::Initializing => "INITIALIZING",
            ExecutionState::Running => "RUNNING",
            ExecutionState::Finished => "FINISHED",
            ExecutionState::Canceling => "CANCELING",
            ExecutionState::Canceled => "CANCELED",
            ExecutionState::Failed => "FAILED",
            ExecutionState::Reconciling => "RECONCILING",
        }
    }
}

impl fmt::Display for ExecutionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Lifecycle for ExecutionState {
    fn can_transition_to(self, next: ExecutionState) -> bool {
        use ExecutionState::*;
        if self.is_terminal() {
            return false;
        }
        if next == Failed {
            return true;
        }
        match self {
            Created => matches!(next, Scheduled | Canceled | Reconciling),
            Scheduled => matches!(next, Deploying | Canceling | Canceled),
            Deploying => matches!(next, Initializing | Canceling),
            Initializing => matches!(next, Running | Finished | Canceling),
            Running => matches!(next, Finished | Canceling),
            Canceling => matches!(next, Canceled),
            // A new leader takes over a subtask in the state its TaskManager reports, which
            // may be DEPLOYING (deployed, not yet initializing).
            Reconciling => matches!(next, Deploying | Initializing | Running | Finished | Canceled),
            Finished | Canceled | Failed => false,
        }
    }

    fn is_terminal(self) -> bool {
        matches!(self, ExecutionState::Finished | ExecutionState::Canceled | ExecutionState::Failed)
    }

    fn all() -> &'static [ExecutionState] {
        use ExecutionState::*;
        &[Created, Scheduled, Deploying, Initializing, Running, Finished, Canceling, Canceled, Failed, Reconciling]
    }
}

/// A transition the state machine refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition from {from} to {to}")]
pub struct IllegalTransition {
    /// The state the machine was in.
    pub from: String,
    /// The state that was asked for.
    pub to: String,
}

/// One recorded transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition<S> {
    /// The state entered.
    pub state: S,
    /// When it was entered, epoch milliseconds.
    pub at_ms: u64,
}

/// A state machine's current state and its timestamped history.
#[derive(Clone, Debug)]
pub struct StateHistory<S: Lifecycle> {
    current: S,
    transitions: Vec<Transition<S>>,
}

impl<S: Lifecycle> StateHistory<S> {
    /// Starts in `initial`, entered at `at_ms`.
    pub fn new(initial: S, at_ms: u64) -> StateHistory<S> {
        StateHistory { current: initial, transitions: vec![Transition { state: initial, at_ms }] }
    }

    /// The current state.
    pub fn current(&self) -> S {
        self.current
    }

    /// Moves to `next` at `at_ms`, or refuses an illegal move and changes nothing.
    pub fn transition(&mut self, next: S, at_ms: u64) -> Result<(), IllegalTransition> {
        if !self.current.can_transition_to(next) {
            return Err(IllegalTransition { from: self.current.to_string(), to: next.to_string() });
        }
        self.current = next;
        self.transitions.push(Transition { state: next, at_ms });
        Ok(())
    }

    /// Every transition so far, oldest first (the first entry is the initial state).
    pub fn transitions(&self) -> &[Transition<S>] {
        &self.transitions
    }

    /// When the machine last entered `state`, epoch milliseconds.
    pub fn last_entered(&self, state: S) -> Option<u64> {
        self.transitions.iter().rev().find(|t| t.state == state).map(|t| t.at_ms)
    }

    /// When the machine first entered `state`, epoch milliseconds.
    pub fn first_entered(&self, state: S) -> Option<u64> {
        self.transitions.iter().find(|t| t.state == state).map(|t| t.at_ms)
    }

    /// When the current state was entered.
    pub fn current_since(&self) -> u64 {
        self.transitions.last().map(|t| t.at_ms).unwrap_or_default()
    }
}

/// Milliseconds since the Unix epoch, from the wall clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_happy_path_and_timestamps() {
        let mut h = StateHistory::new(JobStatus::Initializing, 1);
        h.transition(JobStatus::Created, 2).unwrap();
        h.transition(JobStatus::Running, 3).unwrap();
        h.transition(JobStatus::Finished, 4).unwrap();
        assert_eq!(h.current(), JobStatus::Finished);
        assert_eq!(h.last_entered(JobStatus::Running), Some(3));
        assert_eq!(h.transitions().len(), 4);
    }

    #[test]
    fn terminal_states_cannot_be_left() {
        for &terminal in &[JobStatus::Finished, JobStatus::Failed, JobStatus::Canceled, JobStatus::Suspended] {
            for &next in JobStatus::all() {
                assert!(!terminal.can_transition_to(next), "{terminal} -> {next}");
            }
        }
        for &terminal in &[ExecutionState::Finished, ExecutionState::Failed, ExecutionState::Canceled] {
            for &next in ExecutionState::all() {
                assert!(!terminal.can_transition_to(next), "{terminal} -> {next}");
            }
        }
    }

    #[test]
    fn illegal_job_transition_is_refused_and_changes_nothing() {
        let mut h = StateHistory::new(JobStatus::Created, 1);
        let err = h.transition(JobStatus::Finished, 2).unwrap_err();
        assert_eq!(err.to_string(), "illegal transition from CREATED to FINISHED");
        assert_eq!(h.current(), JobStatus::Created);
        assert_eq!(h.transitions().len(), 1);
    }

    #[test]
    fn failure_and_cancel_paths() {
        let mut h = StateHistory::new(JobStatus::Running, 1);
        h.transition(JobStatus::Failing, 2).unwrap();
        h.transition(JobStatus::Failed, 3).unwrap();
        let mut c = StateHistory::new(JobStatus::Running, 1);
        c.transition(JobStatus::Cancelling, 2).unwrap();
        assert!(c.transition(JobStatus::Running, 3).is_err());
        c.transition(JobStatus::Canceled, 3).unwrap();
    }

    #[test]
    fn subtask_normal_path_and_failure_from_anywhere() {
        use ExecutionState::*;
        let mut h = StateHistory::new(Created, 0);
        for (i, s) in [Scheduled, Deploying, Initializing, Running, Finished].into_iter().enumerate() {
            h.transition(s, i as u64).unwrap();
        }
        for &s in ExecutionState::all() {
            if !s.is_terminal() {
                assert!(s.can_transition_to(Failed), "{s} -> FAILED");
            }
        }
        assert!(!Created.can_transition_to(Running));
        assert!(Running.can_transition_to(Canceling));
        assert!(!Running.can_transition_to(Canceled));
    }

    /// A new leader takes a subtask over in whatever live state its TaskManager reports; a
    /// refused move left it RECONCILING, and a restart then counted it ended though it ran.
    #[test]
    fn a_subtask_taken_over_may_be_in_any_live_state_its_taskmanager_reports() {
        use ExecutionState::*;
        for reported in [Deploying, Initializing, Running, Finished, Canceled] {
            let mut h = StateHistory::new(Reconciling, 0);
            assert!(h.transition(reported, 1).is_ok(), "RECONCILING -> {reported}");
        }
    }

    #[test]
    fn states_serialize_as_flink_names() {
        assert_eq!(serde_json::to_string(&JobStatus::Running).unwrap(), "\"RUNNING\"");
        assert_eq!(serde_json::to_string(&ExecutionState::Canceling).unwrap(), "\"CANCELING\"");
        for &s in JobStatus::all() {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{}\"", s.name()));
        }
    }
}
