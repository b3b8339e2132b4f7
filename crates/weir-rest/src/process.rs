//! This process's CPU time, memory and threads from `/proc/self`, for `/metrics`: the
//! counterparts of Flink's `Status.JVM.CPU.*` and `Status.JVM.Threads.Count`, and
//! Prometheus's standard `process_*` metrics (weir has no JVM heap to report).

/// One reading of the process's resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcessStats {
    /// CPU time used, user and system, in nanoseconds.
    pub cpu_ns: u64,
    /// Resident memory, bytes.
    pub resident_bytes: u64,
    /// Virtual memory, bytes.
    pub virtual_bytes: u64,
    /// Threads.
    pub threads: u64,
    /// When the process started, epoch seconds.
    pub start_time_seconds: u64,
    /// Open file descriptors.
    pub open_fds: u64,
}

impl ProcessStats {
    /// This process now; `None` where `/proc` is not there (not Linux).
    pub(crate) fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces; the fields after it are counted from
        // the closing parenthesis.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        // SAFETY: sysconf only reads a system constant.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        let cpu_ticks = field(14)? + field(15)?;
        let boot_seconds = boot_time_seconds().unwrap_or(0);
        Some(ProcessStats {
            cpu_ns: cpu_ticks * 1_000_000_000 / ticks,
            resident_bytes: field(24)? * page,
            virtual_bytes: field(23)?,
            threads: field(20)?,
            start_time_seconds: boot_seconds + field(22)? / ticks,
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64),
        })
    }
}

/// When the machine booted, epoch seconds (`btime` of `/proc/stat`).
fn boot_time_seconds() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::ProcessStats;

    #[test]
    fn this_process_is_read_from_proc() {
        let stats = ProcessStats::read().expect("the tests run on Linux");
        assert!(stats.threads >= 1 && stats.resident_bytes > 0 && stats.virtual_bytes >= stats.resident_bytes);
        assert!(stats.open_fds >= 3, "{stats:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(stats.start_time_seconds <= now && stats.start_time_seconds + 3600 > now, "{stats:?}");
        // Some CPU time is used by the time a test runs; spinning adds more.
        let before = stats.cpu_ns;
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {}
        assert!(ProcessStats::read().unwrap().cpu_ns > before);
    }
}
