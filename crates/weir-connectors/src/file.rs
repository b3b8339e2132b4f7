//! Text files: a parallel line source over one file (and, re-exported, the file sink of
//! [`crate::file_sink`]).
//!
//! [`TextLineSource`] splits the file into `p` byte ranges; each subtask reads the lines that
//! start in its range.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use weir_api::error::TaskError;
use weir_api::operator::TaskContext;
use weir_api::snapshot::Redistribution;
use weir_api::source::{Boundedness, Source, SourcePoll, SourcePositions, SourceReader};

pub use crate::file_sink::FileSink;

/// Read buffer of a text line reader.
const READ_BUFFER_BYTES: usize = 1 << 20;

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

    fn check_restore(&self, positions: &[Vec<u8>]) -> Result<Vec<String>, String> {
        let ranges = Self::decode_positions(positions).map_err(|e| e.to_string())?;
        if let Some((start, end)) = ranges.iter().find(|(start, end)| start > end) {
            return Err(format!(
                "text line source: a checkpointed range {start}..{end} ends before it starts; the snapshot is corrupt"
            ));
        }
        Ok(Vec::new())
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fs;
    use weir_api::operator::BATCH_RECORDS_MAX;

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

    proptest! {
        /// The positions of a reader that read some lines, one element mutated (offsets
        /// past the end, ranges that end before they start, huge lengths): restoring and
        /// reading are errors or lines of the file, never a panic or a claimed-size
        /// allocation.
        #[test]
        fn mutated_positions_restore_or_fail_cleanly(
            read in 0usize..6,
            parallelism in 1u32..=3,
            element in any::<prop::sample::Index>(),
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("in.txt");
            let lines: Vec<String> = (0..12).map(|i| format!("line {i}")).collect();
            fs::write(&path, lines.join("\n")).unwrap();
            let source = TextLineSource::new(&path);
            let mut elements = Vec::new();
            for index in 0..parallelism {
                let mut reader = source.create_reader(&TaskContext::for_test(index, parallelism, 8)).unwrap();
                let mut batch = Vec::new();
                let _ = reader.poll_next(&mut batch, read.max(1)).unwrap();
                elements.extend(reader.snapshot_positions().elements);
            }
            prop_assume!(!elements.is_empty());
            let at = element.index(elements.len());
            elements[at] = weir_types::fuzzing::mutate(&elements[at], &mutations);
            let restored = weir_types::fuzzing::with_allocation_cap(64 << 20, || {
                let _ = source.check_restore(&elements);
                let Ok(mut reader) = source.restore_reader(&TaskContext::for_test(0, 1, 8), elements) else { return Vec::new() };
                let mut got = Vec::new();
                for _ in 0..1000 {
                    let mut batch = Vec::new();
                    match reader.poll_next(&mut batch, BATCH_RECORDS_MAX) {
                        Ok(SourcePoll::Data) => got.append(&mut batch),
                        Ok(SourcePoll::Idle(_)) => {}
                        Ok(SourcePoll::End) | Err(_) => break,
                    }
                }
                got
            });
            match restored {
                Err(refused) => prop_assert!(false, "restoring asked for {} bytes at once", refused),
                // A crafted offset may start inside a line: its tail is read as a line.
                Ok(got) => prop_assert!(got.iter().all(|line| lines.iter().any(|l| l.ends_with(line.as_str()))), "{:?}", got),
            }
        }
    }
}
