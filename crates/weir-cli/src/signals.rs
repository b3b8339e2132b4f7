//! SIGTERM and SIGINT for the long-running processes: the first asks the process to stop
//! gracefully (each process says what that means for it), a second one exits at once.
//!
//! Installed explicitly rather than left to the defaults because a process that runs as PID 1
//! in a container has no default action for SIGTERM: without a handler it would ignore the
//! signal and wait out its pod's whole grace period before being killed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The signal that asked the process to stop, once one came.
#[derive(Clone, Default)]
pub struct StopRequest {
    requested: Arc<AtomicBool>,
}

impl StopRequest {
    /// True once SIGTERM or SIGINT arrived.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// The flag itself, for loops that take one.
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.requested)
    }
}

/// Handles SIGTERM and SIGINT from now on: the first sets the returned request and runs
/// `on_first` (on the signal thread, so it may block while it stops things); a second signal
/// exits the process at once with 128 + its number, as a shell reports a killed process.
pub fn on_termination(name: &'static str, on_first: impl FnOnce(i32) + Send + 'static) -> std::io::Result<StopRequest> {
    let request = StopRequest::default();
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    let requested = request.flag();
    std::thread::Builder::new().name("weir-signals".into()).spawn(move || {
        let mut on_first = Some(on_first);
        for signal in signals.forever() {
            if requested.swap(true, Ordering::SeqCst) {
                eprintln!("{name}: second signal ({}): exiting now", signal_name(signal));
                // Skipping every destructor is what the user asks for with a second signal.
                #[allow(clippy::disallowed_methods)]
                std::process::exit(128 + signal);
            }
            eprintln!("{name}: {} received: stopping (send it again to exit at once)", signal_name(signal));
            if let Some(first) = on_first.take() {
                // A second signal is still handled while this runs: the iterator is only
                // read again after it returns, so run it on a thread of its own.
                let _ = std::thread::Builder::new().name("weir-stop".into()).spawn(move || first(signal));
            }
        }
    })?;
    Ok(request)
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "signal",
    }
}
