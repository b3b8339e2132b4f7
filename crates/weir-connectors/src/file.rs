//! Text files: a parallel line source over one file and a sink writing one part file per subtask.
//!
//! [`TextLineSource`] splits the file into `p` byte ranges; each subtask reads the lines that
//! start in its range. [`FileSink`] writes `.part-<job8>-<attempt>-<subtask>-<n>.inprogress` (hidden
//! from readers by the leading dot) and renames it to `part-<job8>-<attempt>-<subtask>-<n>` once
//! committed.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use weir_api::error::TaskError;
use weir_api::operator::TaskContext;
use weir_api::sink::{Sink, SinkWriter};
use weir_api::snapshot::Redistribution;
use weir_api::source::{Boundedness, Source, SourcePoll, SourcePositions, SourceReader};

/// Read buffer of a text line reader.
const READ_BUFFER_BYTES: usize = 1 << 20;
/// Write buffer of a part file.
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Formatted bytes collected before they are handed to the part file's buffer.
const FORMAT_CHUNK_BYTES: usize = 64 << 10;

/// A bounded source of the lines of one UTF-8 text file, without their `\n` (or `\r\n`).
#[derive(Clone, Debug)]
pub struct TextLineSource {
    path: PathBuf,
}

impl TextLineSource {
    /// A source of the lines of the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> TextLineSource {
        TextLineSource { path: path.into() }
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Decodes position elements of [`SourceReader::snapshot_positions`]: byte ranges
    /// `(next_line_offset, end)` still to read.
    pub fn decode_positions(elements: &[Vec<u8>]) -> Result<Vec<(u64, u64)>, TaskError> {
        let mut ranges = Vec::with_capacity(elements.len());
        for bytes in elements {
            let range: (u64, u64) = postcard::from_bytes(bytes).map_err(|e| {
                TaskError::external(
                    "text line source: decoding a checkpointed position",
                    format!("{e}; the snapshot is corrupt or its source state was not written by a text line source"),
                )
            })?;
            ranges.push(range);
        }
        Ok(ranges)
    }

    /// Opens the file and computes subtask `ctx.subtask_index`'s byte range `[start, end)`.
    fn open_range(&self, ctx: &TaskContext) -> Result<(File, u64, u64), TaskError> {
        let (parallelism, index) = (ctx.parallelism, ctx.subtask_index);
        if parallelism == 0 || index >= parallelism {
            return Err(TaskError::Internal(format!(
                "text line source: invalid task context (subtask {index} of {parallelism})"
            )));
        }
        let open_error = |e: std::io::Error| {
            TaskError::external(
                format!("text line source: opening {}", self.path.display()),
                format!("{e}; check that the file exists and is readable"),
            )
        };
        let file = File::open(&self.path).map_err(open_error)?;
        let metadata = file.metadata().map_err(open_error)?;
        if metadata.is_dir() {
            return Err(TaskError::external(
                format!("text line source: opening {}", self.path.display()),
                "it is a directory; give the path of a text file",
            ));
        }
        let len = u128::from(metadata.len());
        let (p, i) = (u128::from(parallelism), u128::from(index));
        // Both bounds are at most `len`, so they fit in u64.
        let start = (i * len / p) as u64;
        let end = ((i + 1) * len / p) as u64;
        Ok((file, start, end))
    }
}

impl Source<String> for TextLineSource {
    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_reader(&self, ctx: &TaskContext) -> Result<Box<dyn SourceReader<String>>, TaskError> {
        let (file, start, end) = self.open_range(ctx)?;
        if start == 0 {
            let first = TextLineReader::new(self.path.clone(), file, 0, end)?;
            return Ok(Box::new(RangesReader { path: self.path.clone(), current: Some(first), pending: Vec::new() }));
        }
        // The line containing byte `start - 1` belongs to an earlier subtask: ours begin after
        // the first '\n' at or after `start - 1`.
        let mut first = TextLineReader::new(self.path.clone(), file, start - 1, end)?;
        first.skip_to_next_line()?;
        Ok(Box::new(RangesReader { path: self.path.clone(), current: Some(first), pending: Vec::new() }))
    }

    fn restore_reader(
        &self,
        _ctx: &TaskContext,
        positions: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SourceReader<String>>, TaskError> {
        // Split state: this subtask resumes the ranges assigned to it, each at a line start.
        let mut pending = Self::decode_positions(&positions)?;
        pending.reverse();
        Ok(Box::new(RangesReader { path: self.path.clone(), current: None, pending }))
    }
}

/// Reads a list of byte ranges of the file, one after the other (restored subtasks may hold
/// several old subtasks' ranges after a rescale).
struct RangesReader {
    path: PathBuf,
    current: Option<TextLineReader>,
    /// Ranges still to open, last first.
    pending: Vec<(u64, u64)>,
}

impl SourceReader<String> for RangesReader {
    fn poll_next(&mut self, out: &mut Vec<String>, max_records: usize) -> Result<SourcePoll, TaskError> {
        loop {
            if let Some(reader) = &mut self.current {
                match reader.poll_next(out, max_records)? {
                    SourcePoll::End => self.current = None,
                    other => return Ok(other),
                }
            }
            let Some((pos, end)) = self.pending.pop() else {
                return Ok(SourcePoll::End);
            };
            let file = File::open(&self.path).map_err(|e| read_error(&self.path, pos, e))?;
            self.current = Some(TextLineReader::new(self.path.clone(), file, pos, end)?);
        }
    }

    fn snapshot_positions(&self) -> SourcePositions {
        let mut elements = Vec::new();
        let mut push = |range: (u64, u64)| {
            // Serializing a pair of integers into memory cannot fail.
            elements.push(postcard::to_allocvec(&range).unwrap_or_default());
        };
        if let Some(reader) = &self.current
            && !reader.done
        {
            push((reader.pos, reader.end));
        }
        for range in self.pending.iter().rev() {
            push(*range);
        }
        SourcePositions { mode: Redistribution::Split, elements }
    }
}

/// Reads the lines starting in `[.., end)` from `pos` on.
struct TextLineReader {
    path: PathBuf,
    reader: BufReader<File>,
    /// Byte offset of the next line.
    pos: u64,
    /// Lines starting at or after this offset belong to the next subtask.
    end: u64,
    /// The current line's bytes (reused).
    line: Vec<u8>,
    done: bool,
}

impl TextLineReader {
    fn new(path: PathBuf, mut file: File, pos: u64, end: u64) -> Result<TextLineReader, TaskError> {
        if pos > 0 {
            file.seek(SeekFrom::Start(pos)).map_err(|e| read_error(&path, pos, e))?;
        }
        Ok(TextLineReader {
            path,
            reader: BufReader::with_capacity(READ_BUFFER_BYTES, file),
            pos,
            end,
            line: Vec::new(),
            done: pos >= end,
        })
    }

    /// Moves past the next '\n' (or to the end of the file).
    fn skip_to_next_line(&mut self) -> Result<(), TaskError> {
        let skipped = self.reader.skip_until(b'\n').map_err(|e| read_error(&self.path, self.pos, e))?;
        self.pos += skipped as u64;
        self.done = self.pos >= self.end;
        Ok(())
    }
}

fn read_error(path: &Path, offset: u64, e: std::io::Error) -> TaskError {
    TaskError::external(
        format!("text line source: reading {} at byte {offset}", path.display()),
        format!("{e}; check that the file is readable and was not truncated while being read"),
    )
}

impl TextLineReader {
    fn poll_next(&mut self, out: &mut Vec<String>, max_records: usize) -> Result<SourcePoll, TaskError> {
        if self.done {
            return Ok(SourcePoll::End);
        }
        let budget = max_records.saturating_sub(out.len());
        let mut produced = 0;
        while produced < budget {
            self.line.clear();
            let read =
                self.reader.read_until(b'\n', &mut self.line).map_err(|e| read_error(&self.path, self.pos, e))?;
            if read == 0 {
                self.done = true;
                break;
            }
            let line_start = self.pos;
            let mut content: &[u8] = &self.line;
            if let Some(rest) = content.strip_suffix(b"\n") {
                content = rest;
            }
            if let Some(rest) = content.strip_suffix(b"\r") {
                content = rest;
            }
            let text = std::str::from_utf8(content).map_err(|e| {
                TaskError::external(
                    format!("text line source: reading {}", self.path.display()),
                    format!(
                        "invalid UTF-8 at byte offset {}; the source reads UTF-8 text only, convert the file",
                        line_start + e.valid_up_to() as u64
                    ),
                )
            })?;
            out.push(text.to_owned());
            produced += 1;
            // Advance only once the line is delivered, so the position never skips a line.
            self.pos += read as u64;
            if self.pos >= self.end {
                self.done = true;
                break;
            }
        }
        if produced == 0 && self.done { Ok(SourcePoll::End) } else { Ok(SourcePoll::Data) }
    }
}

/// The committed name of part file `counter` of `subtask`: `part-<job8>-<attempt>-<subtask>-<counter>`
/// (`job8` here is the run prefix `<first 8 of the job id>-<attempt>`).
pub fn part_file_name(job8: &str, subtask: u32, counter: u64) -> String {
    format!("part-{job8}-{subtask}-{counter}")
}

/// The name of part file `counter` of `subtask` while it is written:
/// `.part-<job8>-<attempt>-<subtask>-<counter>.inprogress` (the leading dot hides it from readers).
pub fn in_progress_name(job8: &str, subtask: u32, counter: u64) -> String {
    format!(".{}.inprogress", part_file_name(job8, subtask, counter))
}

/// The name of part file `counter` of `subtask` once closed at a checkpoint barrier and
/// waiting for that checkpoint to complete: `.part-<job8>-<attempt>-<subtask>-<counter>.pending`.
pub fn pending_name(job8: &str, subtask: u32, counter: u64) -> String {
    format!(".{}.pending", part_file_name(job8, subtask, counter))
}

/// The run prefix of part file names: the first 8 characters of the job id and the attempt
/// (`4f1c2e0d-0`), so a restarted attempt never reuses a name an earlier one committed.
fn job8(ctx: &TaskContext) -> String {
    let job: String = ctx.job_id.to_string().chars().take(8).collect();
    format!("{job}-{}", ctx.attempt)
}

/// Writes records as lines into part files of a directory: exactly once with checkpoints.
///
/// Two-phase commit: a subtask writes `.part-<job8>-<attempt>-<subtask>-<n>.inprogress`; at a
/// checkpoint barrier the file is closed, synced and renamed `.pending` (the pre-commit, its
/// name stored in the checkpoint); when the checkpoint completes it is renamed
/// `part-<job8>-<attempt>-<subtask>-<n>` (the commit). A restore commits the pending files its
/// snapshot lists and deletes the hidden files its old job left behind, whose records the
/// restored sources replay. Without checkpoints, files are committed when the input ends.
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
            dir: self.dir.clone(),
            job8: job8(ctx),
            subtask: ctx.subtask_index,
            counter: 0,
            format: self.format,
            text: String::new(),
            part: None,
            staged: Vec::new(),
            finished: false,
            commit_at_end: !ctx.waits_for_final_checkpoint(),
        }
    }
}

/// A pending commit: the pending file and the name it gets when committed (both relative to
/// the output directory, so the snapshot stays valid when the directory moves).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Committable {
    pending: String,
    committed: String,
}

impl<T: Send + 'static> Sink<T> for FileSink<T> {
    fn create_writer(&self, ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        self.create_dir()?;
        Ok(Box::new(self.writer(ctx)))
    }

    fn exclusive_target(&self) -> Option<String> {
        let absolute = std::path::absolute(&self.dir).unwrap_or_else(|_| self.dir.clone());
        Some(absolute.display().to_string())
    }

    fn restore_writer(
        &self,
        ctx: &TaskContext,
        committables: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        self.create_dir()?;
        // Union state: every subtask sees every pending commit; subtask 0 alone finishes them.
        if ctx.subtask_index == 0 {
            let mut decoded = Vec::with_capacity(committables.len());
            for bytes in &committables {
                let committable: Committable = postcard::from_bytes(bytes).map_err(|e| {
                    TaskError::external(
                        "file sink: restoring pending commits",
                        format!("{e}; the snapshot's sink state was not written by a file sink"),
                    )
                })?;
                decoded.push(committable);
            }
            commit_restored(&self.dir, &decoded, &job8(ctx), ctx.attempt)?;
        }
        Ok(Box::new(self.writer(ctx)))
    }
}

/// Commits the pending files of a restored snapshot (idempotent: an already committed file is
/// fine) and deletes the other hidden files of the runs they came from and of this job's
/// earlier attempts (`run` is this attempt's prefix, `<job8>-<attempt>`).
fn commit_restored(dir: &Path, committables: &[Committable], run: &str, attempt: u32) -> Result<(), TaskError> {
    let mut old_jobs = std::collections::BTreeSet::new();
    for committable in committables {
        commit_file(dir, &committable.pending, &committable.committed)?;
        let mut segments = committable.committed.strip_prefix("part-").unwrap_or_default().split('-');
        if let (Some(job), Some(old_attempt)) = (segments.next(), segments.next()) {
            old_jobs.insert(format!("{job}-{old_attempt}"));
        }
    }
    let job = run.split('-').next().unwrap_or_default();
    for earlier in 0..attempt {
        old_jobs.insert(format!("{job}-{earlier}"));
    }
    old_jobs.remove(run);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(_) => return Ok(()),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let leftover = old_jobs.iter().any(|job| name.starts_with(&format!(".part-{job}-")));
        if leftover {
            // Records after the restored checkpoint: the restored sources produce them again.
            let _ = fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Renames `pending` to `committed` in `dir` unless that already happened.
fn commit_file(dir: &Path, pending: &str, committed: &str) -> Result<(), TaskError> {
    let pending_path = dir.join(pending);
    let committed_path = dir.join(committed);
    if committed_path.exists() && !pending_path.exists() {
        return Ok(());
    }
    fs::rename(&pending_path, &committed_path).map_err(|e| {
        TaskError::external(
            format!("file sink: committing {} as {}", pending_path.display(), committed_path.display()),
            format!("{e}; the pending file of a completed checkpoint is missing or the directory is not writable"),
        )
    })?;
    sync_dir(dir);
    Ok(())
}

/// Makes renames durable; not every file system can fsync a directory, and the data itself
/// is synced before any rename, so a failure here is not an error.
fn sync_dir(dir: &Path) {
    if let Ok(handle) = File::open(dir) {
        let _ = handle.sync_all();
    }
}

/// One part file being written.
struct InProgressPart {
    writer: BufWriter<File>,
    in_progress: PathBuf,
}

impl InProgressPart {
    /// Creates (or truncates a leftover) in-progress part file `counter` of `subtask`.
    fn open(dir: &Path, job8: &str, subtask: u32, counter: u64) -> Result<InProgressPart, TaskError> {
        let in_progress = dir.join(in_progress_name(job8, subtask, counter));
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(&in_progress).map_err(|e| {
            TaskError::external(
                format!("file sink: creating {}", in_progress.display()),
                format!("{e}; check the permissions of the output directory"),
            )
        })?;
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

    /// Flushes, fsyncs and renames the part to `pending` (the pre-commit).
    fn close_as(mut self, pending: &Path) -> Result<(), TaskError> {
        self.flush()?;
        self.writer.get_ref().sync_all().map_err(|e| self.write_error(e))?;
        fs::rename(&self.in_progress, pending).map_err(|e| {
            TaskError::external(
                format!("file sink: closing {} as {}", self.in_progress.display(), pending.display()),
                format!("{e}; check the permissions of the output directory"),
            )
        })
    }
}

struct FileSinkWriter<T> {
    dir: PathBuf,
    job8: String,
    subtask: u32,
    /// Number of the next part file.
    counter: u64,
    format: fn(&T, &mut String),
    /// Formatted records not yet handed to the part file (reused).
    text: String,
    /// The part being written; opened at the first record after a barrier.
    part: Option<InProgressPart>,
    /// Closed parts waiting for their checkpoint: (checkpoint id, committable).
    staged: Vec<(u64, Committable)>,
    finished: bool,
    /// Without periodic checkpoints the end of input commits; with them the job's final
    /// checkpoint does, so a failure before it replays nothing twice.
    commit_at_end: bool,
}

impl<T> FileSinkWriter<T> {
    fn current_part(&mut self) -> Result<&mut InProgressPart, TaskError> {
        if self.finished {
            return Err(TaskError::Internal("file sink: write after finish".into()));
        }
        if self.part.is_none() {
            self.part = Some(InProgressPart::open(&self.dir, &self.job8, self.subtask, self.counter)?);
        }
        self.part.as_mut().ok_or_else(|| TaskError::Internal("file sink: no open part".into()))
    }

    /// Closes the open part as pending for `checkpoint_id` (nothing if no record came).
    fn stage(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        let Some(part) = self.part.take() else {
            return Ok(());
        };
        let pending = pending_name(&self.job8, self.subtask, self.counter);
        let committed = part_file_name(&self.job8, self.subtask, self.counter);
        part.close_as(&self.dir.join(&pending))?;
        self.counter += 1;
        self.staged.push((checkpoint_id, Committable { pending, committed }));
        Ok(())
    }

    /// Commits every staged part of checkpoints up to `checkpoint_id`.
    fn commit_up_to(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        let mut index = 0;
        while index < self.staged.len() {
            if self.staged[index].0 <= checkpoint_id {
                let (_, committable) = self.staged.remove(index);
                commit_file(&self.dir, &committable.pending, &committable.committed)?;
            } else {
                index += 1;
            }
        }
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
        for (_, committable) in &self.staged {
            // Serializing two strings into memory cannot fail.
            committables.push(postcard::to_allocvec(committable).unwrap_or_default());
        }
        Ok(committables)
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.commit_up_to(checkpoint_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use weir_api::operator::BATCH_RECORDS_MAX;

    #[test]
    fn two_file_sinks_into_one_directory_are_refused_when_the_job_is_built() {
        use weir_api::prelude::*;
        let dir = tempfile::tempdir().unwrap();
        let format = |n: &u64, out: &mut String| out.push_str(&n.to_string());
        let env = StreamExecutionEnvironment::new();
        let numbers = env.from_source(VecSource::new(vec![1u64, 2, 3]));
        numbers.sink_to(FileSink::new(dir.path(), format)).uid("first");
        numbers.sink_to(FileSink::new(dir.path().join("."), format)).uid("second");
        numbers.sink_to(FileSink::new(dir.path().join("other"), format)).uid("third");
        let error = env.build("two sinks").err().expect("refused");
        let message = error.to_string();
        assert!(message.contains("sinks 'first' and 'second' both write to"), "{message}");
        assert!(message.contains("give each sink its own directory"), "{message}");
    }

    fn drain(reader: &mut dyn SourceReader<String>, max_records: usize) -> Vec<String> {
        let mut all = Vec::new();
        let mut batch = Vec::new();
        loop {
            match reader.poll_next(&mut batch, max_records).unwrap() {
                SourcePoll::Data => all.append(&mut batch),
                SourcePoll::Idle(_) => panic!("a file source went idle"),
                SourcePoll::End => return all,
            }
        }
    }

    fn read_all(path: &Path, parallelism: u32, max_records: usize) -> Vec<String> {
        let source = TextLineSource::new(path);
        let mut lines = Vec::new();
        for index in 0..parallelism {
            let mut reader = source.create_reader(&TaskContext::for_test(index, parallelism, 128)).unwrap();
            lines.extend(drain(reader.as_mut(), max_records));
        }
        lines
    }

    /// The lines of `content`: split at '\n', a final '\n' does not start another line.
    fn expected_lines(content: &str) -> Vec<String> {
        let body = content.strip_suffix('\n').unwrap_or(content);
        if content.is_empty() { Vec::new() } else { body.split('\n').map(str::to_owned).collect() }
    }

    #[test]
    fn reads_lines_and_strips_line_endings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        fs::write(&path, "a\r\n\nb\nlast").unwrap();
        assert_eq!(read_all(&path, 1, 10), vec!["a", "", "b", "last"]);
        assert_eq!(read_all(&path, 3, 1), vec!["a", "", "b", "last"]);
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let source = TextLineSource::new("/nonexistent/weir/input.txt");
        let err = source.create_reader(&TaskContext::for_test(0, 1, 8)).err().unwrap();
        assert!(err.to_string().contains("/nonexistent/weir/input.txt"), "{err}");
        assert_eq!(err.domain(), weir_api::error::ErrorDomain::External);
    }

    #[test]
    fn directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let source = TextLineSource::new(dir.path());
        assert!(source.create_reader(&TaskContext::for_test(0, 1, 8)).is_err());
    }

    #[test]
    fn invalid_utf8_names_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.txt");
        fs::write(&path, b"ok\nab\xffc\n").unwrap();
        let mut reader = TextLineSource::new(&path).create_reader(&TaskContext::for_test(0, 1, 8)).unwrap();
        let mut out = Vec::new();
        let err = reader.poll_next(&mut out, 10).err().unwrap().to_string();
        assert!(err.contains("bad.txt") && err.contains("byte offset 5"), "{err}");
    }

    #[test]
    fn position_is_the_next_line_and_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        fs::write(&path, "one\ntwo\nthree\nfour\n").unwrap();
        let source = TextLineSource::new(&path);
        let ctx = TaskContext::for_test(0, 1, 8);
        let mut reader = source.create_reader(&ctx).unwrap();
        assert_eq!(TextLineSource::decode_positions(&reader.snapshot_positions().elements).unwrap(), vec![(0, 19)]);
        let mut out = Vec::new();
        reader.poll_next(&mut out, 2).unwrap();
        assert_eq!(out, vec!["one", "two"]);
        let positions = reader.snapshot_positions().elements;
        assert_eq!(TextLineSource::decode_positions(&positions).unwrap(), vec![(8, 19)]);
        let mut resumed = source.restore_reader(&ctx, positions).unwrap();
        assert_eq!(drain(resumed.as_mut(), BATCH_RECORDS_MAX), vec!["three", "four"]);
    }

    proptest! {
        #[test]
        fn subtasks_read_every_line_once(
            lines in proptest::collection::vec("[a-z\u{e9}\u{4e2d} ]{0,12}", 0..40),
            final_newline in any::<bool>(),
            parallelism in 1u32..=4,
            max_records in 1usize..8,
        ) {
            let mut content = lines.join("\n");
            if final_newline && !lines.is_empty() {
                content.push('\n');
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("in.txt");
            fs::write(&path, &content).unwrap();
            let mut got = read_all(&path, parallelism, max_records);
            let mut expected = expected_lines(&content);
            got.sort();
            expected.sort();
            prop_assert_eq!(got, expected);
        }
    }

    fn format_u64(n: &u64, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(out, "{n}");
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn part_files_are_committed_on_finish() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("out").join("nested");
        let sink = FileSink::new(&dir, format_u64);
        let mut writers: Vec<_> =
            (0..2).map(|index| sink.create_writer(&TaskContext::for_test(index, 2, 8)).unwrap()).collect();
        for (index, writer) in writers.iter_mut().enumerate() {
            let base = index as u64 * 100;
            let mut batch = vec![base, base + 1];
            writer.write_batch(&mut batch).unwrap();
            assert!(batch.is_empty());
            writer.write_batch(&mut vec![base + 2]).unwrap();
            writer.flush().unwrap();
        }
        assert_eq!(names(&dir), vec![".part-00000000-0-0-0.inprogress", ".part-00000000-0-1-0.inprogress"]);
        for writer in &mut writers {
            writer.finish().unwrap();
            writer.finish().unwrap();
        }
        assert_eq!(names(&dir), vec!["part-00000000-0-0-0", "part-00000000-0-1-0"]);
        assert_eq!(fs::read_to_string(dir.join("part-00000000-0-0-0")).unwrap(), "0\n1\n2\n");
        assert_eq!(fs::read_to_string(dir.join("part-00000000-0-1-0")).unwrap(), "100\n101\n102\n");
        assert!(writers[0].write_batch(&mut vec![7]).is_err());
    }

    #[test]
    fn large_batches_are_written_completely() {
        let dir = tempfile::tempdir().unwrap();
        let sink = FileSink::new(dir.path(), format_u64);
        let mut writer = sink.create_writer(&TaskContext::for_test(0, 1, 8)).unwrap();
        let mut expected = String::new();
        for round in 0..50u64 {
            let mut batch: Vec<u64> = (round * 5000..(round + 1) * 5000).collect();
            for n in &batch {
                expected.push_str(&format!("{n}\n"));
            }
            writer.write_batch(&mut batch).unwrap();
        }
        writer.finish().unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("part-00000000-0-0-0")).unwrap(), expected);
    }

    #[test]
    fn uncreatable_directory_is_an_error_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let blocker = root.path().join("file");
        fs::write(&blocker, "x").unwrap();
        let sink = FileSink::new(blocker.join("sub"), format_u64);
        let err = sink.create_writer(&TaskContext::for_test(0, 1, 8)).err().unwrap().to_string();
        assert!(err.contains("file/sub"), "{err}");
    }

    #[test]
    fn part_file_naming() {
        assert_eq!(part_file_name("abcdef01", 3, 0), "part-abcdef01-3-0");
        assert_eq!(in_progress_name("abcdef01", 3, 0), ".part-abcdef01-3-0.inprogress");
    }

    #[allow(clippy::ptr_arg)] // the sink formats its record type, which is String here
    fn format_line(line: &String, out: &mut String) {
        out.push_str(line);
    }

    #[test]
    fn two_phase_commit_stages_at_the_barrier_and_commits_on_completion() {
        let dir = tempfile::tempdir().unwrap();
        let sink = FileSink::new(dir.path(), format_line);
        let ctx = TaskContext::for_test(0, 1, 8);
        let mut writer = sink.create_writer(&ctx).unwrap();
        writer.write_batch(&mut vec!["a".to_string(), "b".to_string()]).unwrap();
        let committables = writer.prepare_commit(1).unwrap();
        assert_eq!(committables.len(), 1);
        assert_eq!(names(dir.path()), vec![".part-00000000-0-0-0.pending"]);
        writer.write_batch(&mut vec!["c".to_string()]).unwrap();
        writer.commit(1).unwrap();
        assert_eq!(names(dir.path()), vec![".part-00000000-0-0-1.inprogress", "part-00000000-0-0-0"]);
        assert_eq!(fs::read_to_string(dir.path().join("part-00000000-0-0-0")).unwrap(), "a\nb\n");

        // A crash now: the restore commits what the snapshot lists and drops the rest.
        let pending = writer.prepare_commit(2).unwrap();
        drop(writer);
        let mut restored_ctx = TaskContext::for_test(0, 2, 8);
        restored_ctx.job_id = weir_types::JobId::from_u128(u128::MAX);
        let _ = sink.restore_writer(&restored_ctx, pending.clone()).unwrap();
        assert_eq!(names(dir.path()), vec!["part-00000000-0-0-0", "part-00000000-0-0-1"]);
        // Restoring twice from the same snapshot is harmless.
        let _ = sink.restore_writer(&restored_ctx, pending).unwrap();
        assert_eq!(names(dir.path()), vec!["part-00000000-0-0-0", "part-00000000-0-0-1"]);
    }

    #[test]
    fn a_restore_discards_files_written_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let sink = FileSink::new(dir.path(), format_line);
        let ctx = TaskContext::for_test(0, 1, 8);
        let mut writer = sink.create_writer(&ctx).unwrap();
        writer.write_batch(&mut vec!["kept".to_string()]).unwrap();
        let snapshot = writer.prepare_commit(1).unwrap();
        writer.write_batch(&mut vec!["replayed later".to_string()]).unwrap();
        let _after_the_checkpoint = writer.prepare_commit(2).unwrap();
        writer.write_batch(&mut vec!["also replayed".to_string()]).unwrap();
        writer.flush().unwrap();
        drop(writer);
        let mut restored_ctx = TaskContext::for_test(0, 1, 8);
        restored_ctx.job_id = weir_types::JobId::from_u128(u128::MAX);
        let _ = sink.restore_writer(&restored_ctx, snapshot).unwrap();
        assert_eq!(names(dir.path()), vec!["part-00000000-0-0-0"]);
        assert_eq!(fs::read_to_string(dir.path().join("part-00000000-0-0-0")).unwrap(), "kept\n");
    }
}
