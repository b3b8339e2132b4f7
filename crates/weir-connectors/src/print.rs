//! A sink printing records as lines to stdout.

use std::io::{self, Write};

use weir_api::error::TaskError;
use weir_api::operator::TaskContext;
use weir_api::sink::{Sink, SinkWriter};

/// Writes every record, formatted by a function and followed by `\n`, to stdout.
///
/// Each batch is formatted into one buffer and written under a single stdout lock, so lines
/// of different subtasks never interleave within a line. A closed stdout (e.g. `| head`) is
/// an External error "stdout closed", never a panic.
pub struct PrintSink<T> {
    format: fn(&T, &mut String),
}

impl<T> PrintSink<T> {
    /// A sink printing each record as formatted by `format` (which appends to the String).
    pub fn new(format: fn(&T, &mut String)) -> PrintSink<T> {
        PrintSink { format }
    }
}

impl<T: Send + 'static> Sink<T> for PrintSink<T> {
    fn create_writer(&self, _ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        Ok(Box::new(PrintWriter { format: self.format, text: String::new(), out: LockedStdout }))
    }

    fn writes_to_stdout(&self) -> bool {
        true
    }
}

/// Stdout, locked once per call (so one `write_all` is one uninterrupted write).
struct LockedStdout;

impl Write for LockedStdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stdout().lock().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        io::stdout().lock().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().lock().flush()
    }
}

fn stdout_error(e: io::Error) -> TaskError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        TaskError::external("print sink", "stdout closed")
    } else {
        TaskError::external("print sink: writing to stdout", format!("{e}; check where stdout is redirected"))
    }
}

struct PrintWriter<T, W> {
    format: fn(&T, &mut String),
    /// The formatted batch (reused).
    text: String,
    out: W,
}

impl<T: Send, W: Write + Send> SinkWriter<T> for PrintWriter<T, W> {
    fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        self.text.clear();
        for record in batch.drain(..) {
            (self.format)(&record, &mut self.text);
            self.text.push('\n');
        }
        let result = self.out.write_all(self.text.as_bytes()).map_err(stdout_error);
        self.text.clear();
        result
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        self.out.flush().map_err(stdout_error)
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        self.out.flush().map_err(stdout_error)
    }

    fn prepare_commit(&mut self, _checkpoint_id: u64) -> Result<Vec<Vec<u8>>, TaskError> {
        // Not transactional: printed lines cannot be retracted on restore (at-least-once).
        SinkWriter::<T>::flush(self)?;
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn format_u64(n: &u64, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(out, "n={n}");
    }

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.0.lock().unwrap().1 += 1;
            Ok(())
        }
    }

    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    #[test]
    fn formats_batches_as_lines() {
        let shared = Shared::default();
        let mut writer = PrintWriter { format: format_u64, text: String::new(), out: shared.clone() };
        let mut batch = vec![1u64, 2];
        writer.write_batch(&mut batch).unwrap();
        assert!(batch.is_empty());
        writer.write_batch(&mut vec![3]).unwrap();
        writer.flush().unwrap();
        writer.finish().unwrap();
        let (bytes, flushes) = shared.0.lock().unwrap().clone();
        assert_eq!(String::from_utf8(bytes).unwrap(), "n=1\nn=2\nn=3\n");
        assert_eq!(flushes, 2);
    }

    #[test]
    fn closed_stdout_is_an_external_error() {
        let mut writer = PrintWriter { format: format_u64, text: String::new(), out: ClosedPipe };
        let err = writer.write_batch(&mut vec![1]).err().unwrap();
        assert_eq!(err.domain(), weir_api::error::ErrorDomain::External);
        assert!(err.to_string().contains("stdout closed"), "{err}");
        assert!(writer.finish().is_err());
    }

    #[test]
    fn prints_to_stdout() {
        let sink = PrintSink::new(format_u64);
        let mut writer = sink.create_writer(&TaskContext::for_test(0, 1, 8)).unwrap();
        // An empty batch: exercises the stdout path without cluttering the test output.
        writer.write_batch(&mut Vec::new()).unwrap();
        writer.finish().unwrap();
    }
}
