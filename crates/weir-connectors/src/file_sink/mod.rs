//! A sink writing one part file per subtask and checkpoint into a directory, exactly once.
//!
//! Two-phase commit, as Flink's `FileSink`: a subtask writes
//! `.part-<job>-<attempt>-<subtask>-<n>.inprogress` (hidden from readers by the leading dot);
//! at a checkpoint barrier the file is flushed, synced and renamed `.pending`, and the
//! directory synced (the pre-commit: its directory and name go into the checkpoint); when the
//! checkpoint completes it is renamed `part-<job>-<attempt>-<subtask>-<n>` (the commit).
//! Without periodic checkpoints, files are committed when the input ends. Names are built and
//! parsed in [`names`]; what a restore does in [`recovery`].
//!
//! Each writer holds an exclusive lock ([`std::fs::File::try_lock`]) on every hidden file it
//! still needs, until the file is committed: a restore removes only hidden files of the runs
//! it takes over, and of those only the ones no live process holds, so a job restored from
//! another job's savepoint into the same directory never disturbs the other job.
//!
//! A savepoint's barrier also writes a [`SavepointMarker`] listing the parts staged then: the
//! savepoint names them and only its restore commits them, so a restore keeps the pending
//! files a marker lists; the writer removes the marker once those parts are committed.

pub mod names;
pub mod recovery;

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use weir_api::error::TaskError;
use weir_api::operator::TaskContext;
use weir_api::sink::{Sink, SinkWriter};
use weir_api::snapshot::{Barrier, BarrierKind};

pub use names::{PartName, SavepointMarker};
use recovery::{Committable, commit_part, sync_dir};

/// Write buffer of a part file.
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Formatted bytes collected before they are handed to the part file's buffer.
const FORMAT_CHUNK_BYTES: usize = 64 << 10;

/// Writes records as lines into part files of a directory: exactly once with checkpoints
/// (module documentation).
pub struct FileSink<T> {
    dir: PathBuf,
    format: fn(&T, &mut String),
}

impl<T> FileSink<T> {
    /// A sink writing into `dir` (created when missing), each record formatted by `format`
    /// (which appends to the given String) and followed by `\n`.
    pub fn new(dir: impl Into<PathBuf>, format: fn(&T, &mut String)) -> FileSink<T> {
        FileSink { dir: dir.into(), format }
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The output directory as an absolute path (what checkpoints record).
    fn absolute_dir(&self) -> PathBuf {
        std::path::absolute(&self.dir).unwrap_or_else(|_| self.dir.clone())
    }

    fn create_dir(&self) -> Result<(), TaskError> {
        fs::create_dir_all(&self.dir).map_err(|e| {
            TaskError::external(
                format!("file sink: creating output directory {}", self.dir.display()),
                format!("{e}; check the path and the permissions of its parent"),
            )
        })
    }

    fn writer(&self, ctx: &TaskContext) -> FileSinkWriter<T> {
        FileSinkWriter {
            dir: self.absolute_dir(),
            job: ctx.job_id.to_string(),
            attempt: ctx.attempt,
            subtask: ctx.subtask_index,
            counter: 0,
            format: self.format,
            text: String::new(),
            part: None,
            staged: Vec::new(),
            markers: Vec::new(),
            finished: false,
            commit_at_end: !ctx.waits_for_final_checkpoint(),
        }
    }
}

impl<T: Send + 'static> Sink<T> for FileSink<T> {
    fn create_writer(&self, ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        self.create_dir()?;
        if ctx.subtask_index == 0 && ctx.attempt > 0 {
            // A restart without a checkpoint: what earlier attempts left hidden is replayed.
            let job = ctx.job_id.to_string();
            recovery::remove_orphans(&self.dir, &Default::default(), None, &job, ctx.attempt);
        }
        Ok(Box::new(self.writer(ctx)))
    }

    fn exclusive_target(&self) -> Option<String> {
        Some(self.absolute_dir().display().to_string())
    }

    fn restore_writer(
        &self,
        ctx: &TaskContext,
        committables: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        self.create_dir()?;
        // Union state: every subtask sees every pending commit; subtask 0 alone finishes them.
        let decoded = recovery::decode_all(&committables)
            .map_err(|reason| TaskError::external("file sink: restoring pending commits", reason))?;
        if ctx.subtask_index == 0 {
            let snapshot_job = ctx.restored_operator().map(|restored| restored.snapshot_job_id.as_str());
            recovery::commit_restored(&self.dir, &decoded, snapshot_job, &ctx.job_id.to_string(), ctx.attempt)?;
        }
        Ok(Box::new(self.writer(ctx)))
    }

    fn check_restore(&self, committables: &[Vec<u8>]) -> Result<Vec<String>, String> {
        let decoded = recovery::decode_all(committables)?;
        Ok(recovery::describe_restore(&self.absolute_dir(), &decoded))
    }
}

/// One part file being written, locked while this writer needs it.
struct InProgressPart {
    writer: BufWriter<File>,
    in_progress: PathBuf,
}

impl InProgressPart {
    /// Creates (or truncates a leftover) in-progress part file and locks it.
    fn open(dir: &Path, name: &PartName) -> Result<InProgressPart, TaskError> {
        let in_progress = dir.join(name.in_progress());
        let create_error = |e: std::io::Error| {
            TaskError::external(
                format!("file sink: creating {}", in_progress.display()),
                format!("{e}; check the permissions of the output directory"),
            )
        };
        let file =
            OpenOptions::new().write(true).create(true).truncate(true).open(&in_progress).map_err(create_error)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(TaskError::external(
                    format!("file sink: locking {}", in_progress.display()),
                    "another process holds the file; is a second job writing part files of this run?",
                ));
            }
            // A file system without locks: the file is written unprotected (restores of other
            // jobs then keep every hidden file, see `recovery::remove_orphans`).
            Err(std::fs::TryLockError::Error(_)) => {}
        }
        Ok(InProgressPart { writer: BufWriter::with_capacity(WRITE_BUFFER_BYTES, file), in_progress })
    }

    fn write_error(&self, e: std::io::Error) -> TaskError {
        TaskError::external(
            format!("file sink: writing {}", self.in_progress.display()),
            format!("{e}; check free space and permissions of the output directory"),
        )
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), TaskError> {
        self.writer.write_all(bytes).map_err(|e| self.write_error(e))
    }

    /// Hands buffered bytes to the file (no fsync, no rename).
    fn flush(&mut self) -> Result<(), TaskError> {
        self.writer.flush().map_err(|e| self.write_error(e))
    }

    /// Flushes, fsyncs and renames the part to `pending`, then syncs the directory (the
    /// pre-commit). Returns the open file, whose lock keeps the pending file ours.
    fn close_as(mut self, pending: &Path) -> Result<File, TaskError> {
        self.flush()?;
        self.writer.get_ref().sync_all().map_err(|e| self.write_error(e))?;
        fs::rename(&self.in_progress, pending).map_err(|e| {
            TaskError::external(
                format!("file sink: closing {} as {}", self.in_progress.display(), pending.display()),
                format!("{e}; check the permissions of the output directory"),
            )
        })?;
        if let Some(dir) = pending.parent() {
            sync_dir(dir);
        }
        let writer = self.writer;
        writer.into_inner().map_err(|e| {
            TaskError::external(format!("file sink: closing {}", pending.display()), e.error().to_string())
        })
    }
}

/// A part closed at a barrier, waiting for its checkpoint.
struct StagedPart {
    checkpoint_id: u64,
    name: PartName,
    /// Kept open for its lock until the part is committed.
    _locked: File,
}

struct FileSinkWriter<T> {
    /// The output directory, absolute.
    dir: PathBuf,
    job: String,
    attempt: u32,
    subtask: u32,
    /// Number of the next part file.
    counter: u64,
    format: fn(&T, &mut String),
    /// Formatted records not yet handed to the part file (reused).
    text: String,
    /// The part being written; opened at the first record after a barrier.
    part: Option<InProgressPart>,
    /// Closed parts waiting for their checkpoint.
    staged: Vec<StagedPart>,
    /// Savepoint markers written, by savepoint id, until their parts are committed.
    markers: Vec<(u64, PathBuf)>,
    finished: bool,
    /// Without periodic checkpoints the end of input commits; with them the job's final
    /// checkpoint does, so a failure before it replays nothing twice.
    commit_at_end: bool,
}

impl<T> FileSinkWriter<T> {
    fn part_name(&self) -> PartName {
        PartName { job: self.job.clone(), attempt: self.attempt, subtask: self.subtask, counter: self.counter }
    }

    fn current_part(&mut self) -> Result<&mut InProgressPart, TaskError> {
        if self.finished {
            return Err(TaskError::Internal("file sink: write after finish".into()));
        }
        if self.part.is_none() {
            self.part = Some(InProgressPart::open(&self.dir, &self.part_name())?);
        }
        self.part.as_mut().ok_or_else(|| TaskError::Internal("file sink: no open part".into()))
    }

    /// Closes the open part as pending for `checkpoint_id` (nothing if no record came).
    fn stage(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        let Some(part) = self.part.take() else {
            return Ok(());
        };
        let name = self.part_name();
        let locked = part.close_as(&self.dir.join(name.pending()))?;
        self.counter += 1;
        self.staged.push(StagedPart { checkpoint_id, name, _locked: locked });
        Ok(())
    }

    /// Commits every staged part of checkpoints up to `checkpoint_id`.
    fn commit_up_to(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        let mut index = 0;
        while index < self.staged.len() {
            if self.staged[index].checkpoint_id > checkpoint_id {
                index += 1;
                continue;
            }
            let staged = self.staged.remove(index);
            if commit_part(&self.dir, &staged.name)? == recovery::CommitOutcome::Missing {
                tracing::warn!(
                    file = %self.dir.join(staged.name.pending()).display(),
                    "file sink: a pending part vanished before its commit; its records are lost to readers"
                );
            }
        }
        // A marker lists parts staged up to its savepoint: all committed now.
        let mut removed = false;
        self.markers.retain(|(savepoint, path)| {
            if *savepoint > checkpoint_id {
                return true;
            }
            if let Err(error) = fs::remove_file(path)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %path.display(), %error, "file sink: cannot remove a savepoint marker");
            }
            removed = true;
            false
        });
        if removed {
            sync_dir(&self.dir);
        }
        Ok(())
    }

    /// Writes the marker of savepoint `savepoint`, listing every part staged now (synced, as
    /// the pre-commit is: the savepoint completes only after this returns).
    fn mark_savepoint(&mut self, savepoint: u64) -> Result<(), TaskError> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let marker = SavepointMarker {
            job: self.job.clone(),
            attempt: self.attempt,
            subtask: self.subtask,
            checkpoint_id: savepoint,
        };
        let path = self.dir.join(marker.file_name());
        let mut text = String::new();
        for staged in &self.staged {
            text.push_str(&staged.name.committed());
            text.push('\n');
        }
        let failed = |e: std::io::Error| {
            TaskError::external(
                format!("file sink: writing the savepoint marker {}", path.display()),
                format!("{e}; check free space and permissions of the output directory"),
            )
        };
        let temporary = self.dir.join(format!("{}.tmp", marker.file_name()));
        let mut file = File::create(&temporary).map_err(failed)?;
        file.write_all(text.as_bytes()).map_err(failed)?;
        file.sync_all().map_err(failed)?;
        fs::rename(&temporary, &path).map_err(failed)?;
        sync_dir(&self.dir);
        self.markers.push((savepoint, path));
        Ok(())
    }
}

impl<T: Send> SinkWriter<T> for FileSinkWriter<T> {
    fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        if batch.is_empty() {
            return Ok(());
        }
        let format = self.format;
        let mut text = std::mem::take(&mut self.text);
        text.clear();
        let part = self.current_part()?;
        let mut result = Ok(());
        for record in batch.drain(..) {
            format(&record, &mut text);
            text.push('\n');
            if text.len() >= FORMAT_CHUNK_BYTES {
                result = part.write(text.as_bytes());
                text.clear();
                if result.is_err() {
                    break;
                }
            }
        }
        if result.is_ok() && !text.is_empty() {
            result = part.write(text.as_bytes());
        }
        text.clear();
        self.text = text;
        batch.clear();
        result
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        match &mut self.part {
            Some(part) => part.flush(),
            None => Ok(()),
        }
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        if !self.commit_at_end {
            // The final checkpoint's barrier stages the open part; its completion commits it.
            return self.flush();
        }
        // End of input without checkpoints: there is no later point to commit at.
        self.stage(u64::MAX)?;
        self.commit_up_to(u64::MAX)?;
        self.finished = true;
        Ok(())
    }

    fn prepare_commit(&mut self, checkpoint_id: u64) -> Result<Vec<Vec<u8>>, TaskError> {
        self.stage(checkpoint_id)?;
        let mut committables = Vec::with_capacity(self.staged.len());
        for staged in &self.staged {
            committables.push(Committable { dir: Some(self.dir.clone()), name: staged.name.clone() }.encode());
        }
        Ok(committables)
    }

    fn prepare_commit_at(&mut self, barrier: &Barrier) -> Result<Vec<Vec<u8>>, TaskError> {
        let committables = self.prepare_commit(barrier.checkpoint_id)?;
        if matches!(barrier.kind, BarrierKind::Savepoint { .. }) {
            self.mark_savepoint(barrier.checkpoint_id)?;
        }
        Ok(committables)
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.commit_up_to(checkpoint_id)
    }
}

#[cfg(test)]
mod tests;
