//! What the job master does to the world, as values, and the one interface that carries it
//! out.
//!
//! The job's states decide; every action that leaves the job master is a [`MasterEffect`]
//! handed to [`MasterIo::carry_out`]: a deploy or a takeover of an attempt, a control message
//! or a cancel to the subtasks, the end of RECONCILING, a write to the HA store. A
//! JobManager carries them out with [`ClusterIo`]: the executor, the subtasks' control
//! channels and cancel flags, and the job's HA store. It is also the fence: an effect on
//! the tasks is refused once this JobManager no longer leads, as the HA store refuses its
//! writes. The job master's stepped tests put
//! their own io around it: they see every effect in order, in the trace a failing seed
//! prints, and check what a JobManager that lost its leadership still does.
//!
//! The checkpoint coordinator's I/O (snapshot metadata, HA pointers, deletions) has its
//! own interface, [`crate::checkpointing::driver::CheckpointIo`], driven by its book.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Sender;
use weir_api::error::TaskError;
use weir_api::snapshot::TaskControl;

use crate::executor::{AttemptHandle, AttemptSpec, Executor, ReportedAttempt};

/// Which running subtasks a control message goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipients {
    /// The sources (a barrier starts there).
    Sources,
    /// Every subtask.
    All,
}

/// A write to the job's HA store (none without high availability).
#[derive(Clone, Debug)]
pub enum HaWrite {
    /// The next attempt number, before an attempt with a lower one deploys: no later leader
    /// reuses a number.
    NextAttempt(u32),
    /// A savepoint request in flight (a new leader fails it: its checkpoint is abandoned).
    SavepointRequest {
        /// The request's id.
        request_id: String,
        /// A stop-with-savepoint.
        terminate: bool,
    },
    /// The savepoint request ended.
    ForgetSavepointRequest {
        /// The request's id.
        request_id: String,
    },
    /// The job's end: no later leader recovers it.
    Result(weir_ha::JobResult),
}

/// One action of the job master on the world.
pub enum MasterEffect {
    /// Deploy an attempt (its control channels are connected here).
    Deploy(AttemptSpec),
    /// Take over an attempt that kept running while no JobManager led.
    Adopt {
        /// The attempt as this master runs it (same number, same region).
        spec: AttemptSpec,
        /// What the TaskManagers reported of it.
        reported: ReportedAttempt,
    },
    /// Stop a reported attempt nobody takes over (an older one of the same region).
    CancelReported {
        /// Its number.
        attempt: u32,
    },
    /// RECONCILING is over: whatever of the job is still reported and not taken over stops.
    EndReconcile,
    /// Forget the control channels of the previous attempts (a new round deploys, or the
    /// reported attempts are taken over).
    ForgetTasks,
    /// A control message to the running subtasks.
    Control {
        /// To whom.
        to: Recipients,
        /// What.
        message: TaskControl,
    },
    /// Tell the subtasks of a pipelined region (every subtask when `None`) to stop.
    StopTasks {
        /// The region.
        region: Option<usize>,
    },
    /// Write to the HA store.
    Record(HaWrite),
}

impl fmt::Debug for MasterEffect {
    /// One line per effect, as a trace shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let region = |spec: &AttemptSpec| spec.region.as_ref().map(|(_, region)| *region);
        match self {
            MasterEffect::Deploy(spec) => {
                write!(
                    f,
                    "Deploy {{ attempt: {}, region: {:?}, restore: {} }}",
                    spec.attempt,
                    region(spec),
                    spec.restore.is_some()
                )
            }
            MasterEffect::Adopt { spec, reported } => {
                write!(
                    f,
                    "Adopt {{ attempt: {}, region: {:?}, subtasks: {} }}",
                    spec.attempt,
                    region(spec),
                    reported.subtasks.len()
                )
            }
            MasterEffect::CancelReported { attempt } => write!(f, "CancelReported {{ attempt: {attempt} }}"),
            MasterEffect::EndReconcile => write!(f, "EndReconcile"),
            MasterEffect::ForgetTasks => write!(f, "ForgetTasks"),
            MasterEffect::Control { to, message } => write!(f, "Control {{ to: {to:?}, message: {message:?} }}"),
            MasterEffect::StopTasks { region } => write!(f, "StopTasks {{ region: {region:?} }}"),
            MasterEffect::Record(write) => write!(f, "Record({write:?})"),
        }
    }
}

impl MasterEffect {
    /// True for an effect that changes what runs on the TaskManagers: a JobManager that lost
    /// its leadership must do none of them (the new leader runs the job; HA writes need no
    /// such care, the store refuses them).
    pub fn touches_tasks(&self) -> bool {
        matches!(
            self,
            MasterEffect::Deploy(_)
                | MasterEffect::Adopt { .. }
                | MasterEffect::CancelReported { .. }
                | MasterEffect::EndReconcile
                | MasterEffect::StopTasks { .. }
        )
    }
}

/// What carrying out an effect gave back.
pub enum Answer {
    /// Done.
    Done,
    /// The attempt deployed or taken over.
    Deployed(Box<dyn AttemptHandle>),
}

/// Why an effect failed.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// The executor could not deploy or take over the attempt.
    #[error(transparent)]
    Deploy(#[from] TaskError),
    /// The HA store refused the write, or did not answer.
    #[error(transparent)]
    Ha(#[from] weir_ha::HaError),
}

impl EffectError {
    /// As the error of a deploy (a refused HA write, or the fence, names itself).
    pub fn into_task_error(self) -> TaskError {
        match self {
            EffectError::Deploy(error) => error,
            EffectError::Ha(error) => TaskError::external("high availability", error),
        }
    }
}

/// Carries out the job master's effects, and answers what it asks of the world.
pub trait MasterIo: Send {
    /// Carries out `effect`.
    fn carry_out(&mut self, effect: MasterEffect) -> Result<Answer, EffectError>;

    /// The attempts of the job running already, as the TaskManagers that registered with
    /// this (new leader) JobManager report them.
    fn reported_attempts(&self) -> Vec<ReportedAttempt>;

    /// True when the job may act: no HA, or this JobManager still holds its leadership.
    fn leading(&self) -> bool;
}

/// The running subtasks' control channels and cancel flags.
#[derive(Default)]
struct TaskLinks {
    /// Control senders per vertex, per subtask.
    controls: Vec<Vec<Sender<TaskControl>>>,
    /// One cancel flag per attempt, or per region in region mode.
    cancel: Vec<Arc<AtomicBool>>,
}

impl TaskLinks {
    /// Gives `spec` fresh control channels and keeps the senders of the vertices it deploys,
    /// with its cancel flag.
    fn connect(&mut self, spec: &mut AttemptSpec) {
        let vertices = spec.job_graph.vertices.len();
        self.controls.resize_with(vertices, Vec::new);
        let region = spec.region.as_ref().map(|(regions, region)| (Arc::clone(regions), *region));
        let deploys =
            |vertex: usize| region.as_ref().is_none_or(|(regions, region)| regions.get(vertex) == Some(region));
        spec.controls = Vec::with_capacity(vertices);
        for (vertex, description) in spec.job_graph.vertices.iter().enumerate() {
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..description.parallelism).map(|_| crossbeam_channel::unbounded::<TaskControl>()).unzip();
            if deploys(vertex) {
                self.controls[vertex] = senders;
            }
            spec.controls.push(receivers);
        }
        match region {
            Some((_, region)) => {
                if self.cancel.len() <= region {
                    self.cancel.resize_with(region + 1, || Arc::new(AtomicBool::new(false)));
                }
                self.cancel[region] = Arc::clone(&spec.cancel);
            }
            None => self.cancel = vec![Arc::clone(&spec.cancel)],
        }
    }

    fn send(&self, vertices: impl Iterator<Item = usize>, message: &TaskControl) {
        for vertex in vertices {
            for control in self.controls.get(vertex).into_iter().flatten() {
                // A subtask that ended dropped its receiver: nothing to tell it.
                let _ = control.send(message.clone());
            }
        }
    }

    fn stop(&self, region: Option<usize>) {
        match region {
            Some(region) => self.cancel.get(region).into_iter().for_each(|flag| flag.store(true, Ordering::SeqCst)),
            None => self.cancel.iter().for_each(|flag| flag.store(true, Ordering::SeqCst)),
        }
    }
}

/// A JobManager's io: the executor, the subtasks' channels and the job's HA store.
pub struct ClusterIo {
    job_id: String,
    executor: Arc<dyn Executor>,
    ha: Option<weir_ha::JobStore>,
    /// The vertices whose subtasks are sources.
    sources: Vec<usize>,
    links: TaskLinks,
}

impl ClusterIo {
    /// The io of job `job_id`, deploying on `executor`, recording in `ha`; `sources` are its
    /// source vertices.
    pub fn new(
        job_id: String,
        executor: Arc<dyn Executor>,
        ha: Option<weir_ha::JobStore>,
        sources: Vec<usize>,
    ) -> Self {
        ClusterIo { job_id, executor, ha, sources, links: TaskLinks::default() }
    }

    fn record(&self, write: HaWrite) -> Result<(), weir_ha::HaError> {
        let Some(ha) = &self.ha else { return Ok(()) };
        match write {
            HaWrite::NextAttempt(next) => ha.set_next_attempt(next),
            HaWrite::SavepointRequest { request_id, terminate } => ha.add_savepoint_request(&request_id, terminate),
            HaWrite::ForgetSavepointRequest { request_id } => ha.remove_savepoint_request(&request_id),
            HaWrite::Result(result) => ha.finish(&result),
        }
    }
}

impl MasterIo for ClusterIo {
    fn carry_out(&mut self, effect: MasterEffect) -> Result<Answer, EffectError> {
        // The fence: checked right before the act, so a leadership lost while the master
        // decided (after its last HA write) changes nothing on the TaskManagers. The new
        // leader reconciles with what runs there.
        if effect.touches_tasks() && !self.leading() {
            return Err(EffectError::Ha(weir_ha::HaError::LostLeadership));
        }
        match effect {
            MasterEffect::Deploy(mut spec) => {
                self.links.connect(&mut spec);
                Ok(Answer::Deployed(self.executor.start(spec)?))
            }
            MasterEffect::Adopt { mut spec, reported } => {
                self.links.connect(&mut spec);
                Ok(Answer::Deployed(self.executor.adopt(spec, &reported)?))
            }
            MasterEffect::CancelReported { attempt } => {
                self.executor.cancel_attempt(&self.job_id, attempt);
                Ok(Answer::Done)
            }
            MasterEffect::EndReconcile => {
                self.executor.reconciled(&self.job_id);
                Ok(Answer::Done)
            }
            MasterEffect::ForgetTasks => {
                self.links.controls.iter_mut().for_each(Vec::clear);
                Ok(Answer::Done)
            }
            MasterEffect::Control { to: Recipients::Sources, message } => {
                self.links.send(self.sources.iter().copied(), &message);
                Ok(Answer::Done)
            }
            MasterEffect::Control { to: Recipients::All, message } => {
                self.links.send(0..self.links.controls.len(), &message);
                Ok(Answer::Done)
            }
            MasterEffect::StopTasks { region } => {
                self.links.stop(region);
                Ok(Answer::Done)
            }
            MasterEffect::Record(write) => Ok(self.record(write).map(|()| Answer::Done)?),
        }
    }

    fn reported_attempts(&self) -> Vec<ReportedAttempt> {
        self.executor.running_attempts(&self.job_id)
    }

    fn leading(&self) -> bool {
        self.ha.as_ref().is_none_or(|ha| ha.guard().is_held())
    }
}
