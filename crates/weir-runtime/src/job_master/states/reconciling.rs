//! RECONCILING: a new leader JobManager recovered the job from the HA store and waits for
//! the TaskManagers to report the attempt that kept running while no leader existed. When
//! every subtask of the job graph is reported (the newest attempt of each pipelined region),
//! the master takes the attempt over without restarting a task: RUNNING, then it sends the
//! completion of the newest completed checkpoint again (a sink whose commit the old leader
//! never sent commits now; commits are idempotent) and aborts every checkpoint the old
//! leader may have left in flight (a stop-with-savepoint that never completed resumes the
//! job). A subtask that failed meanwhile, a TaskManager that never comes back, or
//! `high-availability.reconcile-timeout` without a full report restarts the job from the
//! newest completed checkpoint under its restart strategy, as any failure does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_api::snapshot::TaskControl;
use weir_types::JobStatus;

use super::{Poll, State, state_of};
use crate::executor::ReportedAttempt;
use crate::job_master::MasterEvent;
use crate::job_master::effects::MasterEffect;
use crate::job_master::run::{Incoming, JobRun, mark_canceling};
use crate::job_master::takeover::{self, ReconcileDecision};

/// How often the reports are looked at.
const RECONCILE_POLL: Duration = Duration::from_millis(50);

/// A takeover under way.
#[derive(Default)]
pub(in crate::job_master) struct Reconciling {
    /// When the master began waiting for the TaskManagers' reports.
    began: Option<Instant>,
}

impl Reconciling {
    pub(super) fn poll(&mut self, run: &mut JobRun) -> Poll {
        if self.began.is_none() {
            if let Some(next) = enter(run) {
                return Poll::Go(next);
            }
            self.began = Some(run.clock.now());
        }
        if !run.leading() {
            return Poll::Go(State::Suspended);
        }
        Poll::Wait(RECONCILE_POLL)
    }

    /// Answers what users ask for, then looks at the reports: take the attempt over, wait,
    /// or give up.
    pub(super) fn on_event(&mut self, run: &mut JobRun, incoming: Incoming) -> Option<State> {
        let began = self.began.unwrap_or_else(|| run.clock.now());
        let job_id = run.master.job_id.to_string();
        let cancel = on_request(run, &job_id, incoming);
        let (reported, stale) = takeover::newest_per_region(run.io.reported_attempts(), run.region_count.is_some());
        for attempt in stale {
            run.tell(MasterEffect::CancelReported { attempt });
        }
        let expected: usize = run.dep.job_graph.vertices.iter().map(|v| v.parallelism as usize).sum();
        let coverage = takeover::coverage(&reported, expected, |vertex, region| run.dep.in_region(vertex, region));
        let timed_out = run.clock.now() >= began + run.reconcile_timeout;
        let timeout_text = format!("{:?}", run.reconcile_timeout);
        match takeover::decide(&coverage, cancel, timed_out, &timeout_text) {
            ReconcileDecision::Wait => None,
            ReconcileDecision::TakeOver => {
                let next = take_over(run, &reported, began);
                run.tell(MasterEffect::EndReconcile);
                Some(next)
            }
            ReconcileDecision::Cancel => Some(give_up(run, &reported, None)),
            ReconcileDecision::GiveUp(reason) => Some(give_up(run, &reported, Some(reason))),
        }
    }
}

/// Entering RECONCILING: the old leader's savepoints fail; a job whose leader died before it
/// deployed anything is deployed now (`Some`: RUNNING, or ended).
fn enter(run: &mut JobRun) -> Option<State> {
    // Whatever happens next (a takeover, a restart, a first deploy, a cancel), the old
    // leader's savepoints and stops never complete: their checkpoints are abandoned.
    fail_orphaned_savepoints(run);
    if run.sup.next_attempt != 0 {
        return None;
    }
    // Recorded, but its leader died before deploying anything: deploy it now (anything
    // reported of it is stale).
    let master = Arc::clone(&run.master);
    run.tell(MasterEffect::EndReconcile);
    master.update(|record| master.transition_job(record, JobStatus::Running));
    Some(match super::created::first_deploy(run) {
        Ok(()) => State::Running,
        Err(ended) => ended,
    })
}

/// What users ask for while the job reconciles: savepoints and checkpoints are refused until
/// it runs; true when a cancel came.
fn on_request(run: &mut JobRun, job_id: &str, incoming: Incoming) -> bool {
    let master = Arc::clone(&run.master);
    match incoming {
        Incoming::Event(MasterEvent::Cancel) => return true,
        Incoming::Event(MasterEvent::TriggerSavepoint { request_id, .. }) => master.update(|record| {
            let cause = format!(
                "job {job_id} is RECONCILING (a new leader JobManager takes it over); take the savepoint once it is RUNNING"
            );
            run.savepoint_failed(record, &request_id, cause);
        }),
        Incoming::Event(MasterEvent::TriggerCheckpoint { request_id, .. }) => master.update(|record| {
            let cause = format!(
                "job {job_id} is RECONCILING (a new leader JobManager takes it over); ask for the checkpoint once it is RUNNING"
            );
            record.checkpoint_requests.insert(request_id, crate::job_master::CheckpointRequestStatus::Failed(cause));
        }),
        // Snapshot outcomes of the old leader's checkpoints: nobody waits for them.
        Incoming::Event(_) | Incoming::Nothing | Incoming::TasksClosed => {}
    }
    false
}

/// Takes over what was reported, so that it can be stopped, then cancels the job (no
/// `reason`: a cancel came) or treats the incomplete report as a failure for `reason`
/// (restart from the newest checkpoint).
fn give_up(run: &mut JobRun, reported: &[ReportedAttempt], reason: Option<String>) -> State {
    let master = Arc::clone(&run.master);
    let job_id = master.job_id.to_string();
    let (task_events, task_receiver) = crossbeam_channel::unbounded();
    run.tasks = Some(task_receiver);
    run.forget_tasks();
    for attempt in reported {
        if let Err(error) = run.adopt(attempt, task_events.clone()) {
            tracing::warn!(job_id = %job_id, attempt = attempt.attempt, %error, "cannot take over a reported attempt; it is cancelled");
        }
    }
    // What could not be taken over (a TaskManager of it is gone) is cancelled where it still
    // runs, so it holds neither slots nor threads while the job restarts.
    run.tell(MasterEffect::EndReconcile);
    run.sup.task_events = Some(task_events);
    master.update(|record| {
        let Some(reason) = reason else {
            run.on_cancel(record);
            return;
        };
        tracing::warn!(job_id = %job_id, %reason, "reconciling failed; restarting from the newest completed checkpoint");
        record.exceptions.push(crate::job_master::ExceptionEntry {
            name: "ReconcileFailure".into(),
            message: format!("cannot take over the running job: {reason}"),
            timestamp_ms: weir_types::lifecycle::now_ms(),
            task_name: "job master".into(),
            location: master.location.clone(),
        });
        run.on_failure(record, None, "reconciling", &reason);
        // Subtasks nobody reported will never say they stopped.
        mark_canceling(record, |_| true);
    });
    state_of(master.status(), run)
}

/// Fails the savepoint and stop requests the old leader recorded in the HA store, and
/// deletes their keys: their checkpoints are abandoned on every path out of RECONCILING.
fn fail_orphaned_savepoints(run: &mut JobRun) {
    let orphans = std::mem::take(&mut run.orphaned_savepoints);
    if orphans.is_empty() {
        return;
    }
    let master = Arc::clone(&run.master);
    master.update(|record| {
        for request_id in orphans {
            let cause = format!(
                "the JobManager that was taking this savepoint lost its leadership before it completed; a new leader recovered job {} — trigger the savepoint again",
                master.job_id
            );
            run.savepoint_failed(record, &request_id, cause);
        }
    });
}

/// Adopts the reported attempts and goes RUNNING without restarting a task.
fn take_over(run: &mut JobRun, reported: &[ReportedAttempt], started: Instant) -> State {
    let master = Arc::clone(&run.master);
    let (task_events, task_receiver) = crossbeam_channel::unbounded();
    run.tasks = Some(task_receiver);
    run.forget_tasks();
    for attempt in reported {
        if let Err(error) = run.adopt(attempt, task_events.clone()) {
            master.update(|record| run.on_failure(record, None, "reconciling", &error.to_string()));
            return state_of(master.status(), run);
        }
    }
    if run.region_count.is_some() {
        run.sup.task_events = Some(task_events);
    }
    let latest = run.sup.coordinator.latest_retained().map(|(id, _)| id);
    let (recommit, abandoned) = takeover::after_takeover(latest, run.sup.coordinator.next_checkpoint_id());
    master.update(|record| {
        master.transition_job(record, JobStatus::Running);
        // A checkpoint whose pointer the old leader wrote may never have been committed.
        if let Some(latest) = recommit {
            run.send_to_all(TaskControl::CheckpointComplete(latest));
        }
        // Whatever the old leader triggered after it is abandoned (a stop-with-savepoint
        // included: its subtasks resume, as when a stop fails).
        for id in abandoned {
            run.send_to_all(TaskControl::CheckpointAborted(id));
        }
    });
    tracing::info!(
        job_id = %master.job_id,
        attempts = reported.len(),
        elapsed_ms = run.clock.now().saturating_duration_since(started).as_millis() as u64,
        "took over the running job without restarting it"
    );
    State::Running
}
