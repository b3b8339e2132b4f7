//! `Command::output` that cannot hang the suite: a command still running after its limit is
//! killed and the test fails with what it printed. Shared with the example job's tests
//! (examples/custom-job/tests include this file by path).

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest a command a test runs to completion may take.
pub const RUN_MAX: Duration = Duration::from_secs(240);

/// Runs a command to its end with its output collected, at most [`RUN_MAX`].
pub trait BoundedOutput {
    /// Runs the command (stdin closed), draining its output as it runs.
    fn bounded_output(&mut self) -> std::io::Result<Output>;
}

impl BoundedOutput for Command {
    fn bounded_output(&mut self) -> std::io::Result<Output> {
        let (output, ended) = collect_within(self, RUN_MAX)?;
        assert!(
            ended,
            "{self:?} did not end within {RUN_MAX:?} and was killed. stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(output)
    }
}

/// Runs `command` with stdin closed, draining its stdout and stderr as it runs (a full pipe
/// would stall it), and kills it after `limit`; its output, and whether it ended by itself.
pub fn collect_within(command: &mut Command, limit: Duration) -> std::io::Result<(Output, bool)> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    fn drain(stream: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + limit;
    let mut ended = true;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            ended = false;
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok((Output { status, stdout, stderr }, ended))
}
