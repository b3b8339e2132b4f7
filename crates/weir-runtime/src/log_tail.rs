//! The newest part of this process's log, kept in memory so the REST API can serve it at
//! Flink's `/jobmanager/log` (and an embedded cluster's TaskManager's): wherever the process
//! runs (a pod, a service, a terminal), its log is a click away in the Web UI.
//!
//! The command line's logger writes every line here as well as to stderr. Only the newest
//! [`LOG_TAIL_BYTES`] are kept; older lines are dropped whole.

use std::collections::VecDeque;
use std::sync::Mutex;

/// How much of the log is kept.
pub const LOG_TAIL_BYTES: usize = 1 << 20;

static TAIL: Mutex<Tail> = Mutex::new(Tail { bytes: VecDeque::new() });

struct Tail {
    bytes: VecDeque<u8>,
}

/// Appends `text` (whole lines, as the logger writes them).
pub fn append(text: &[u8]) {
    let mut tail = TAIL.lock().unwrap_or_else(|p| p.into_inner());
    tail.bytes.extend(text);
    let excess = tail.bytes.len().saturating_sub(LOG_TAIL_BYTES);
    if excess > 0 {
        // Drop up to the end of the line the cut falls in, so the log starts at a line.
        let cut = tail.bytes.iter().skip(excess).position(|b| *b == b'\n').map_or(tail.bytes.len(), |p| excess + p + 1);
        tail.bytes.drain(..cut);
    }
}

/// The log kept so far.
pub fn snapshot() -> Vec<u8> {
    let tail = TAIL.lock().unwrap_or_else(|p| p.into_inner());
    tail.bytes.iter().copied().collect()
}

/// A writer for the logger: each write goes to stderr and to the tail.
///
/// A stderr that cannot be written (its reader went away: `weir run ... 2>&1 | head`) loses
/// the line there but not here, and is no error: the logger would report it with
/// `eprintln!`, which panics on that same stderr, in whichever thread logged (a job master
/// mid-checkpoint).
#[derive(Clone, Copy, Debug, Default)]
pub struct TeeToStderr;

impl std::io::Write for TeeToStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        append(buf);
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{LOG_TAIL_BYTES, append, snapshot};

    #[test]
    fn the_tail_keeps_the_newest_whole_lines() {
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..(LOG_TAIL_BYTES / 100 + 50) {
            append(line.as_bytes());
        }
        append(b"the newest line\n");
        let kept = snapshot();
        assert!(kept.len() <= LOG_TAIL_BYTES);
        assert!(kept.starts_with(line.as_bytes()), "the tail starts mid-line");
        assert!(kept.ends_with(b"the newest line\n"));
    }
}
