//! The job master: one job's lifecycle, driven by subtask events on a single thread.
//!
//! Transitions (all checked by [`StateHistory`]): INITIALIZING -> CREATED -> RUNNING, then
//! FINISHED when every subtask finished; FAILING -> FAILED when a subtask fails (restart
//! strategies come with checkpoints); CANCELLING -> CANCELED on a cancel request. The
//! master is the only writer of the job's state; REST and the CLI read snapshots of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use weir_api::error::TaskError;
use weir_api::graph::StreamGraph;
use weir_api::operator::{SystemClock, TaskMetrics};
use weir_types::lifecycle::now_ms;
use weir_types::{ExecutionState, JobId, JobStatus, Lifecycle, StateHistory};

use crate::execution::{JobContext, TaskEvent, TaskEventKind, deploy};
use crate::jobgraph::{JobGraph, JobSettings};

/// Messages to a job master.
#[derive(Debug)]
pub enum MasterEvent {
    /// A subtask changed state.
    Task(TaskEvent),
    /// A user asked to cancel the job.
    Cancel,
}

impl From<TaskEvent> for MasterEvent {
    fn from(event: TaskEvent) -> MasterEvent {
        MasterEvent::Task(event)
    }
}

/// One failure, as the exceptions history shows it.
#[derive(Clone, Debug)]
pub struct ExceptionEntry {
    /// Error class (`UserFunctionError` ...).
    pub name: String,
    /// The error message.
    pub message: String,
    /// When it happened, epoch milliseconds.
    pub timestamp_ms: u64,
    /// The failed task, e.g. `KeyedProcess -> Sink: out (2/4)`.
    pub task_name: String,
    /// Where it ran.
    pub location: String,
}

/// One subtask as the job master tracks it.
pub struct SubtaskRecord {
    /// State and transition times.
    pub history: StateHistory<ExecutionState>,
    /// Live counters.
    pub metrics: Arc<TaskMetrics>,
}

/// The state a job master owns; readers lock it briefly to build views.
pub struct JobRecord {
    /// The job's state and transition times.
    pub history: StateHistory<JobStatus>,
    /// The job graph, once built.
    pub job_graph: Option<Arc<JobGraph>>,
    /// Subtasks per vertex.
    pub subtasks: Vec<Vec<SubtaskRecord>>,
    /// Failures, oldest first.
    pub exceptions: Vec<ExceptionEntry>,
    /// Why the job failed, when it did.
    pub failure_cause: Option<String>,
}

/// A running (or ended) job.
pub struct JobMaster {
    job_id: JobId,
    job_name: String,
    record: Mutex<JobRecord>,
    changed: Condvar,
    control: Sender<MasterEvent>,
    cancel: Arc<AtomicBool>,
    location: String,
}

impl JobMaster {
    /// Accepts `graph` as job `job_id` and starts its master thread.
    pub fn start(
        job_id: JobId,
        graph: StreamGraph,
        settings: JobSettings,
        location: &str,
    ) -> Result<Arc<JobMaster>, TaskError> {
        let (control, events) = crossbeam_channel::unbounded();
        let master = Arc::new(JobMaster {
            job_id,
            job_name: graph.job_name.clone(),
            record: Mutex::new(JobRecord {
                history: StateHistory::new(JobStatus::Initializing, now_ms()),
                job_graph: None,
                subtasks: Vec::new(),
                exceptions: Vec::new(),
                failure_cause: None,
            }),
            changed: Condvar::new(),
            control,
            cancel: Arc::new(AtomicBool::new(false)),
            location: location.to_string(),
        });
        let runner = Arc::clone(&master);
        std::thread::Builder::new()
            .name(format!("weir-jobmaster-{}", &job_id.to_string()[..8]))
            .spawn(move || runner.run(graph, settings, events))
            .map_err(|e| TaskError::external("starting the job master thread", e))?;
        Ok(master)
    }

    /// The job's id.
    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    /// The job's name.
    pub fn job_name(&self) -> &str {
        &self.job_name
    }

    /// Locks the job's record for reading.
    pub fn record(&self) -> MutexGuard<'_, JobRecord> {
        match self.record.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The job's current state.
    pub fn status(&self) -> JobStatus {
        self.record().history.current()
    }

    /// Asks the job to cancel; the answer comes as state changes (CANCELLING, CANCELED).
    pub fn cancel(&self) -> Result<(), JobStatus> {
        let status = self.status();
        if status.is_terminal() {
            return Err(status);
        }
        let _ = self.control.send(MasterEvent::Cancel);
        Ok(())
    }

    /// Blocks until the job reaches a terminal state or `timeout` passes; returns the state.
    pub fn wait_terminal(&self, timeout: Option<Duration>) -> JobStatus {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut record = self.record();
        loop {
            let status = record.history.current();
            if status.is_terminal() {
                return status;
            }
            let wait = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return status;
                    }
                    deadline - now
                }
                None => Duration::from_secs(3600),
            };
            record = match self.changed.wait_timeout(record, wait) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Why the job failed, if it did.
    pub fn failure_cause(&self) -> Option<String> {
        self.record().failure_cause.clone()
    }

    fn update(&self, f: impl FnOnce(&mut JobRecord)) {
        let mut record = self.record();
        f(&mut record);
        drop(record);
        self.changed.notify_all();
    }

    fn transition_job(&self, record: &mut JobRecord, next: JobStatus) {
        if let Err(illegal) = record.history.transition(next, now_ms()) {
            // A refused move is a bug in this file; keep the job in its state and say so.
            tracing::error!(job_id = %self.job_id, error = %illegal, "job state machine refused a transition");
        }
    }

    fn run(self: Arc<Self>, graph: StreamGraph, settings: JobSettings, events: Receiver<MasterEvent>) {
        let job_graph = match JobGraph::build(&graph, &settings) {
            Ok(job_graph) => Arc::new(job_graph),
            Err(error) => {
                self.update(|record| {
                    record.failure_cause = Some(error.to_string());
                    self.transition_job(record, JobStatus::Failed);
                });
                return;
            }
        };
        let metrics: Vec<Vec<Arc<TaskMetrics>>> = job_graph
            .vertices
            .iter()
            .map(|v| (0..v.parallelism).map(|_| Arc::new(TaskMetrics::default())).collect())
            .collect();
        self.update(|record| {
            record.job_graph = Some(Arc::clone(&job_graph));
            record.subtasks = metrics
                .iter()
                .map(|vertex| {
                    vertex
                        .iter()
                        .map(|m| SubtaskRecord {
                            history: StateHistory::new(ExecutionState::Created, now_ms()),
                            metrics: Arc::clone(m),
                        })
                        .collect()
                })
                .collect();
            self.transition_job(record, JobStatus::Created);
        });

        // A cancel that arrived while the job was being created ends it before it runs.
        if let Ok(MasterEvent::Cancel) = events.try_recv() {
            self.update(|record| {
                self.transition_job(record, JobStatus::Cancelling);
                self.transition_job(record, JobStatus::Canceled);
            });
            return;
        }

        self.update(|record| {
            self.transition_job(record, JobStatus::Running);
            for vertex in &mut record.subtasks {
                for subtask in vertex {
                    let _ = subtask.history.transition(ExecutionState::Scheduled, now_ms());
                    let _ = subtask.history.transition(ExecutionState::Deploying, now_ms());
                }
            }
        });
        let job_ctx = JobContext {
            job_id: self.job_id,
            job_name: self.job_name.clone(),
            cancel: Arc::clone(&self.cancel),
            clock: Arc::new(SystemClock),
        };
        let (task_events, task_receiver) = crossbeam_channel::unbounded::<TaskEvent>();
        let graph = Arc::new(graph);
        let handles = match deploy(&graph, &job_graph, &job_ctx, &metrics, &task_events) {
            Ok(handles) => handles,
            Err(error) => {
                self.cancel.store(true, Ordering::SeqCst);
                self.update(|record| {
                    record.failure_cause = Some(error.to_string());
                    self.transition_job(record, JobStatus::Failing);
                    self.transition_job(record, JobStatus::Failed);
                });
                return;
            }
        };
        drop(task_events);
        self.supervise(&job_graph, &events, &task_receiver);
        for handle in handles {
            let _ = handle.join();
        }
    }

    fn supervise(&self, job_graph: &JobGraph, control: &Receiver<MasterEvent>, tasks: &Receiver<TaskEvent>) {
        loop {
            let event = crossbeam_channel::select! {
                recv(control) -> message => match message {
                    Ok(event) => event,
                    Err(_) => continue,
                },
                recv(tasks) -> message => match message {
                    Ok(event) => MasterEvent::Task(event),
                    // Every subtask thread ended and dropped its sender.
                    Err(_) => return,
                },
            };
            let mut finished = false;
            self.update(|record| {
                match event {
                    MasterEvent::Cancel => self.on_cancel(record),
                    MasterEvent::Task(task) => self.on_task_event(record, job_graph, task),
                }
                finished = record.history.current().is_terminal();
            });
            if finished {
                return;
            }
        }
    }

    fn on_cancel(&self, record: &mut JobRecord) {
        let status = record.history.current();
        if status != JobStatus::Running && status != JobStatus::Created {
            return;
        }
        self.transition_job(record, JobStatus::Cancelling);
        self.cancel.store(true, Ordering::SeqCst);
        mark_canceling(record);
        self.settle(record);
    }

    fn on_task_event(&self, record: &mut JobRecord, job_graph: &JobGraph, event: TaskEvent) {
        let Some(subtask) = record.subtasks.get_mut(event.vertex).and_then(|v| v.get_mut(event.subtask as usize))
        else {
            return;
        };
        let now = now_ms();
        match event.kind {
            TaskEventKind::Initializing => {
                let _ = subtask.history.transition(ExecutionState::Initializing, now);
            }
            TaskEventKind::Running => {
                let _ = subtask.history.transition(ExecutionState::Running, now);
            }
            TaskEventKind::Finished => {
                // A subtask that completes after it was asked to cancel counts as canceled,
                // as in Flink.
                let next = if subtask.history.current() == ExecutionState::Canceling {
                    ExecutionState::Canceled
                } else {
                    ExecutionState::Finished
                };
                let _ = subtask.history.transition(next, now);
            }
            TaskEventKind::Canceled => {
                if subtask.history.current() != ExecutionState::Canceling {
                    let _ = subtask.history.transition(ExecutionState::Canceling, now);
                }
                let _ = subtask.history.transition(ExecutionState::Canceled, now);
            }
            TaskEventKind::Failed(error) => {
                let _ = subtask.history.transition(ExecutionState::Failed, now);
                let vertex = &job_graph.vertices[event.vertex];
                let task_name = format!("{} ({}/{})", vertex.name, event.subtask + 1, vertex.parallelism);
                if record.history.current() == JobStatus::Running {
                    // One exceptions entry per failure: the first error of a failover is its
                    // root cause; errors of other subtasks while the job is FAILING are its
                    // consequences and are only logged.
                    record.exceptions.push(ExceptionEntry {
                        name: error.class_name().to_string(),
                        message: error.to_string(),
                        timestamp_ms: now,
                        task_name: task_name.clone(),
                        location: self.location.clone(),
                    });
                    record.failure_cause = Some(format!("{task_name} failed: {error}"));
                    self.transition_job(record, JobStatus::Failing);
                    self.cancel.store(true, Ordering::SeqCst);
                    mark_canceling(record);
                } else {
                    tracing::info!(job_id = %self.job_id, task = %task_name, error = %error, "subtask failed while the job was already ending");
                }
            }
        }
        self.settle(record);
    }

    /// Moves the job to its terminal state once every subtask has ended.
    fn settle(&self, record: &mut JobRecord) {
        let all_ended = record.subtasks.iter().flatten().all(|s| s.history.current().is_terminal());
        if !all_ended {
            return;
        }
        let next = match record.history.current() {
            JobStatus::Running => JobStatus::Finished,
            JobStatus::Failing => JobStatus::Failed,
            JobStatus::Cancelling => JobStatus::Canceled,
            _ => return,
        };
        self.transition_job(record, next);
    }
}

fn mark_canceling(record: &mut JobRecord) {
    let now = now_ms();
    for subtask in record.subtasks.iter_mut().flatten() {
        let state = subtask.history.current();
        if state.is_terminal() {
            continue;
        }
        if state == ExecutionState::Created {
            let _ = subtask.history.transition(ExecutionState::Canceled, now);
        } else {
            let _ = subtask.history.transition(ExecutionState::Canceling, now);
        }
    }
}
