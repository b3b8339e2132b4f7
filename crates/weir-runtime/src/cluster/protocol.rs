//! The control protocol between the JobManager and its TaskManagers: JSON lines.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use weir_api::snapshot::TaskControl;

use crate::checkpointing::writer::WriteOutcome;
use crate::execution::TaskEvent;

/// A job as submitted to a cluster: everything a process needs to build the same graph.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobSubmission {
    /// The catalog name.
    pub job: String,
    /// The job's own arguments.
    pub args: Vec<String>,
    /// Configuration overrides (`key=value`), applied over the cluster's configuration.
    #[serde(default)]
    pub config: Vec<String>,
    /// `-p`.
    #[serde(default)]
    pub parallelism: Option<u32>,
    /// `-s`: a savepoint or retained checkpoint to start from.
    #[serde(default)]
    pub savepoint: Option<String>,
    /// `-n`.
    #[serde(default)]
    pub allow_non_restored_state: bool,
}

/// What a TaskManager's machine offers, as Flink's `HardwareDescription` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hardware {
    /// CPU cores this process may use.
    pub cpu_cores: u32,
    /// Bytes of physical memory (0 where the system does not say).
    pub physical_memory: u64,
}

impl Hardware {
    /// This machine: the cores the process may run on, and `MemTotal` of `/proc/meminfo`.
    pub fn of_this_machine() -> Hardware {
        let cpu_cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let physical_memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or(0, |kib| kib * 1024);
        Hardware { cpu_cores, physical_memory }
    }
}

/// One attempt of a job, deployed to a TaskManager.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeploySpec {
    /// The job id.
    pub job_id: String,
    /// The job's name.
    pub job_name: String,
    /// The attempt.
    pub attempt: u32,
    /// How to build the graph.
    pub submission: JobSubmission,
    /// Parallelism the job graph was built with.
    pub default_parallelism: u32,
    /// Max parallelism of the job.
    pub max_parallelism: u32,
    /// Data address of the TaskManager owning each slot; subtask `i` of every task runs in
    /// slot `i` (slot sharing).
    pub slot_addresses: Vec<String>,
    /// Exactly-once alignment.
    pub exactly_once: bool,
    /// Periodic checkpoints are on: tasks wait for the job's final checkpoint at the end of
    /// their input.
    #[serde(default)]
    pub final_checkpoint: bool,
    /// Incremental checkpoints, every n-th full (`execution.checkpointing.incremental`).
    #[serde(default)]
    pub incremental: Option<u32>,
    /// `state.backend.type: spillable` (the job's; each TaskManager spills into the
    /// directory it names, on its own machine).
    #[serde(default)]
    pub spill: Option<weir_state::spill::SpillOptions>,
    /// The snapshot to restore (a checkpoint or savepoint location).
    pub restore: Option<String>,
    /// `pipeline.auto-watermark-interval`, ms.
    #[serde(default)]
    pub auto_watermark_interval_ms: Option<u64>,
    /// Deploy only this pipelined region (`JobGraph::regions()` numbering); `None`: all.
    /// `slot_addresses` then hold the region's slots.
    #[serde(default)]
    pub region: Option<usize>,
}

/// Messages to the JobManager.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToJobManager {
    /// A TaskManager offers its slots.
    Register {
        /// Its id.
        taskmanager_id: String,
        /// Its slots.
        slots: u32,
        /// Where its data server listens.
        data_address: String,
        /// The attempts it kept running while it had no JobManager (a new leader takes them
        /// over instead of restarting them).
        #[serde(default)]
        running: Vec<RunningAttempt>,
        /// Its machine (absent from an older TaskManager).
        #[serde(default)]
        hardware: Hardware,
    },
    /// Still alive.
    Heartbeat,
    /// The TaskManager is shutting down (SIGTERM): it cancelled its subtasks and closes the
    /// connection next; its subtasks count as failed at once, without a heartbeat timeout.
    Deregister,
    /// A subtask changed state.
    TaskEvent {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// The event.
        event: TaskEvent,
    },
    /// A subtask's snapshot was written (or not).
    Snapshot {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// The outcome.
        outcome: WriteOutcome,
    },
    /// The counters of the attempt's subtasks on this TaskManager (sent periodically, and
    /// once more when they ended), so that REST and `/metrics` on the JobManager show them.
    Metrics {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// One entry per local subtask.
        subtasks: Vec<SubtaskCounters>,
    },
}

/// An attempt a TaskManager runs, with its local subtasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningAttempt {
    /// The job.
    pub job_id: String,
    /// The attempt and its subtasks on this TaskManager.
    pub attempt: crate::executor::ReportedAttempt,
}

/// One subtask's counters (totals since the attempt started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskCounters {
    /// The vertex index in the job graph.
    pub vertex: usize,
    /// The subtask index.
    pub subtask: u32,
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Milliseconds backpressured.
    pub backpressured_ms: u64,
    /// Milliseconds waiting for input.
    #[serde(default)]
    pub idle_ms: u64,
    /// Snapshot bytes read while restoring.
    #[serde(default)]
    pub restored_bytes: u64,
    /// Each chained operator's records out, head first.
    #[serde(default)]
    pub operators: Vec<u64>,
    /// A source's split positions.
    #[serde(default)]
    pub splits: Vec<weir_api::operator::SplitPosition>,
    /// Records a source skipped as undeserialisable.
    #[serde(default)]
    pub records_skipped: u64,
    /// Records that came too late for their windows.
    #[serde(default)]
    pub records_late: u64,
    /// Of `records_late`, those dropped (not sent to a late-data side output).
    #[serde(default)]
    pub records_late_dropped: u64,
    /// The input watermark (order-preserving `u64`, 0 for none: [`weir_api::operator::TaskMetrics::input_watermark`]).
    #[serde(default)]
    pub input_watermark: u64,
    /// Each chained operator's output watermark, head first, encoded as `input_watermark`.
    #[serde(default)]
    pub output_watermarks: Vec<u64>,
    /// Bytes received over TCP.
    #[serde(default)]
    pub bytes_in: u64,
    /// Bytes sent over TCP.
    #[serde(default)]
    pub bytes_out: u64,
    /// Records a sink could not write.
    #[serde(default)]
    pub records_send_errors: u64,
}

/// One message to a TaskManager with the leadership epoch of the JobManager that sent it (0
/// without high availability): every message carries it, and a TaskManager refuses (drops)
/// any whose epoch is lower than the highest it has seen.
#[derive(Debug, Serialize, Deserialize)]
pub struct Frame<M> {
    /// The sender's leadership epoch.
    pub epoch: i64,
    /// The message.
    pub message: M,
}

/// Messages to a TaskManager, each sent in a [`Frame`] with the leader's epoch.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToTaskManager {
    /// The first answer to a registration. A TaskManager refuses a JobManager whose epoch (the
    /// frame's) is lower than one it already followed, and with it every message of that
    /// connection.
    Welcome,
    /// Run the subtasks of these slots.
    Deploy(Box<DeploySpec>),
    /// A control message for one subtask.
    Control {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// The vertex.
        vertex: usize,
        /// The subtask.
        subtask: u32,
        /// The message.
        control: TaskControl,
    },
    /// The JobManager is alive (sent every fifth of `heartbeat.timeout`): a TaskManager that
    /// hears nothing from it for `heartbeat.timeout` counts it as gone.
    Heartbeat,
    /// Stop the attempt's subtasks.
    Cancel {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
    },
}

/// The longest control message, in bytes, newline included: every line on the control
/// connection is refused past it (the connection closes), so a peer that sends a line
/// without an end holds at most this much of the receiver's memory (the allocator's
/// growth steps may touch up to about twice as much). The largest messages are checkpoint
/// acknowledgements, about 85 bytes per key-group block: a subtask with 4 keyed states over
/// 32 768 key groups (Flink's largest max parallelism, at parallelism 1) needs 11 MiB.
pub const CONTROL_LINE_BYTES_MAX: usize = 16 << 20;

/// The longest registration, in bytes: the first line a TaskManager sends, before the
/// JobManager knows it. It lists the attempts the TaskManager runs (a few hundred bytes per
/// local subtask).
pub const REGISTRATION_LINE_BYTES_MAX: usize = 4 << 20;

/// Writes one message as a JSON line; a message longer than [`CONTROL_LINE_BYTES_MAX`] is
/// refused (the receiver would close the connection).
pub fn send<T: Serialize>(writer: &mut impl Write, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    if line.len() > CONTROL_LINE_BYTES_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a control message of {} bytes exceeds the {CONTROL_LINE_BYTES_MAX} bytes the receiver accepts",
                line.len()
            ),
        ));
    }
    writer.write_all(&line)?;
    writer.flush()
}

/// Reads one message of at most [`CONTROL_LINE_BYTES_MAX`] bytes; `Ok(None)` at the end of
/// the connection.
pub fn receive<T: for<'de> Deserialize<'de>>(reader: &mut impl BufRead) -> std::io::Result<Option<T>> {
    receive_at_most(reader, CONTROL_LINE_BYTES_MAX)
}

/// Reads one message of at most `max` bytes (newline included); `Ok(None)` at the end of
/// the connection. A longer line, one cut off by the end of the connection, or one that is
/// not a message is an error (`InvalidData`, or `UnexpectedEof`) saying which; the line
/// read so far never holds more than `max` bytes.
pub fn receive_at_most<T: for<'de> Deserialize<'de>>(
    reader: &mut impl BufRead,
    max: usize,
) -> std::io::Result<Option<T>> {
    let mut line = Vec::new();
    if !read_line_of_at_most(reader, &mut line, max)? {
        return Ok(None);
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not a control message ({e})")))
}

/// Reads up to and including the next newline into `line` (cleared first), holding at most
/// `max` bytes; `Ok(false)` at the end of the connection before any byte.
fn read_line_of_at_most(reader: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> std::io::Result<bool> {
    line.clear();
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if available.is_empty() {
            if line.is_empty() {
                return Ok(false);
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the connection ended inside a control message, after {} bytes", line.len()),
            ));
        }
        let (taken, complete) = match available.iter().position(|&byte| byte == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (available.len(), false),
        };
        let length = line.len() + taken;
        if length > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a control message longer than {max} bytes (at least {length} without its end); refused"),
            ));
        }
        // Grow by doubling, but never past the cap: at most `max` bytes are ever held.
        if line.capacity() < length {
            let target = (line.capacity() * 2).min(max).max(length);
            line.reserve_exact(target - line.len());
        }
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken);
        if complete {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;

    use proptest::prelude::*;
    use weir_types::fuzzing::{Mutation, mutate, with_allocation_cap};

    use super::*;
    use crate::execution::TaskEventKind;
    use crate::executor::{ReportedAttempt, ReportedSubtask};

    /// Valid lines of every direction, one after the other.
    fn sample_lines() -> Vec<u8> {
        let mut lines = Vec::new();
        let register = ToJobManager::Register {
            taskmanager_id: "tm-1".into(),
            slots: 2,
            data_address: "127.0.0.1:4000".into(),
            hardware: Hardware { cpu_cores: 2, physical_memory: 1 << 30 },
            running: vec![RunningAttempt {
                job_id: "a".repeat(32),
                attempt: ReportedAttempt {
                    attempt: 3,
                    region: Some(1),
                    slot_addresses: vec!["127.0.0.1:4000".into(), "127.0.0.1:4001".into()],
                    subtasks: vec![ReportedSubtask {
                        vertex: 1,
                        subtask: 0,
                        state: weir_types::ExecutionState::Running,
                        data_ended: false,
                        taskmanager: String::new(),
                    }],
                },
            }],
        };
        send(&mut lines, &register).unwrap();
        let failed = TaskEvent {
            vertex: 2,
            subtask: 1,
            kind: TaskEventKind::Failed(weir_api::error::TaskError::external("reading", "gone")),
        };
        send(&mut lines, &ToJobManager::TaskEvent { job_id: "a".repeat(32), attempt: 3, event: failed }).unwrap();
        let declined = WriteOutcome::Declined { checkpoint_id: 9, reason: "disk full".into() };
        send(&mut lines, &ToJobManager::Snapshot { job_id: "a".repeat(32), attempt: 3, outcome: declined }).unwrap();
        send(&mut lines, &ToJobManager::Heartbeat).unwrap();
        lines
    }

    /// What a receiver does with bytes: messages until the end or the first error.
    fn decode_lines(bytes: &[u8], max: usize) -> Result<usize, std::io::Error> {
        let mut reader = BufReader::with_capacity(64, bytes);
        let mut messages = 0;
        while receive_at_most::<ToJobManager>(&mut reader, max)?.is_some() {
            messages += 1;
        }
        Ok(messages)
    }

    #[test]
    fn the_sample_lines_decode_and_every_broken_line_is_a_clean_error() {
        assert_eq!(decode_lines(&sample_lines(), CONTROL_LINE_BYTES_MAX).unwrap(), 4);
        let mut cut = sample_lines();
        cut.truncate(cut.len() - 3);
        let error = decode_lines(&cut, CONTROL_LINE_BYTES_MAX).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof, "{error}");
        let error = decode_lines(b"{\"Heartbeat\"\n", CONTROL_LINE_BYTES_MAX).unwrap_err();
        assert!(error.to_string().contains("not a control message"), "{error}");
        // A line over the limit, with or without its end.
        for end in ["", "\n"] {
            let long = format!("\"{}\"{end}", "x".repeat(10_000));
            let error = decode_lines(long.as_bytes(), 4096).unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
            assert!(error.to_string().contains("longer than 4096 bytes"), "{error}");
        }
    }

    /// An endless line is refused once it passes the limit, having held no more than the
    /// limit: every allocation of the read stays within it.
    #[test]
    fn an_endless_line_holds_at_most_the_limit() {
        const LIMIT: usize = 1 << 20;
        let endless = vec![b'x'; 8 * LIMIT];
        let result = with_allocation_cap(LIMIT + 1, || decode_lines(&endless, LIMIT).map_err(|e| e.kind()));
        assert_eq!(result, Ok(Err(std::io::ErrorKind::InvalidData)));
    }

    #[test]
    fn a_message_over_the_limit_is_not_sent() {
        let huge = ToJobManager::TaskEvent {
            job_id: "j".into(),
            attempt: 0,
            event: TaskEvent {
                vertex: 0,
                subtask: 0,
                kind: TaskEventKind::Failed(weir_api::error::TaskError::Internal("x".repeat(CONTROL_LINE_BYTES_MAX))),
            },
        };
        let mut sent = Vec::new();
        let error = send(&mut sent, &huge).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
        assert!(sent.is_empty());
    }

    /// Far above what decoding a few hundred bytes of JSON needs.
    const ALLOCATION_CAP: usize = 1 << 20;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Valid control lines with flipped, inserted, deleted or truncated bytes, or a huge
        /// varint-like run written in: messages or a clean error, never a panic or an
        /// allocation beyond the cap.
        #[test]
        fn mutated_control_lines_decode_or_fail_cleanly(mutations in proptest::collection::vec(any::<Mutation>(), 1..8)) {
            let bytes = mutate(&sample_lines(), &mutations);
            let decoded = with_allocation_cap(ALLOCATION_CAP, || decode_lines(&bytes, CONTROL_LINE_BYTES_MAX).map_err(|e| e.kind()));
            prop_assert!(decoded.is_ok(), "decoding asked for {:?} bytes at once", decoded.err());
        }

        /// Any bytes at all, the TaskManager's side (frames from the JobManager) included.
        #[test]
        fn garbage_control_lines_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let decoded = with_allocation_cap(ALLOCATION_CAP, || {
                let jobmanager_side = decode_lines(&bytes, 1024).map_err(|e| e.kind());
                let mut reader = BufReader::new(bytes.as_slice());
                let taskmanager_side = receive_at_most::<Frame<ToTaskManager>>(&mut reader, 1024).map(|m| m.is_some());
                (jobmanager_side.is_ok(), taskmanager_side.is_ok())
            });
            prop_assert!(decoded.is_ok(), "decoding asked for {:?} bytes at once", decoded.err());
        }
    }
}
