//! `taskmanager.memory.process.size`: a TaskManager that holds more resident memory than its
//! limit fails its subtasks with an error naming the limit and what to change, before the
//! kernel's OOM killer ends the process with nothing said (a JVM TaskManager's
//! `OutOfMemoryError`, in weir's terms). The job restarts as its restart strategy says.

use std::sync::Mutex;

/// The limit and whether the process is over it now.
#[derive(Debug)]
pub(crate) struct MemoryGuard {
    limit: u64,
    /// The failure of this TaskManager's subtasks while it is over the limit.
    over: Mutex<Option<String>>,
}

/// What a look at the process's memory found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum MemoryCheck {
    /// Within the limit.
    Within,
    /// Over it since this look: the reason to fail the subtasks with.
    Exceeded(String),
    /// Still over it.
    StillOver,
}

impl MemoryGuard {
    pub(crate) fn new(limit: u64) -> Self {
        MemoryGuard { limit, over: Mutex::new(None) }
    }

    /// Compares `resident` bytes of TaskManager `taskmanager` with the limit.
    pub(crate) fn check(&self, resident: u64, taskmanager: &str) -> MemoryCheck {
        let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
        if resident <= self.limit {
            *over = None;
            return MemoryCheck::Within;
        }
        if over.is_some() {
            return MemoryCheck::StillOver;
        }
        let reason = format!(
            "TaskManager {taskmanager} holds {} of memory, more than its taskmanager.memory.process.size of {}: \
             its subtasks were failed before the kernel's OOM killer would end the process; raise \
             taskmanager.memory.process.size, give each TaskManager fewer slots (taskmanager.numberOfTaskSlots), \
             or keep keyed state on disk (state.backend.type: spillable or fjall)",
            mebibytes(resident),
            mebibytes(self.limit)
        );
        *over = Some(reason.clone());
        MemoryCheck::Exceeded(reason)
    }

    /// Why subtasks cancelled now failed: the process is over its limit.
    pub(crate) fn failure(&self) -> Option<String> {
        self.over.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn mebibytes(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// The process's resident memory (`VmRSS` of /proc/self/status), `None` where there is none.
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.trim_start_matches("VmRSS:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn going_over_the_limit_fails_once_with_the_sizes_and_coming_back_clears_it() {
        let guard = MemoryGuard::new(100 << 20);
        assert_eq!(guard.check(50 << 20, "tm"), MemoryCheck::Within);
        assert_eq!(guard.failure(), None);
        let MemoryCheck::Exceeded(reason) = guard.check(300 << 20, "tm") else { panic!("not exceeded") };
        assert!(reason.contains("holds 300 MiB") && reason.contains("process.size of 100 MiB"), "{reason}");
        assert_eq!(guard.check(301 << 20, "tm"), MemoryCheck::StillOver);
        assert_eq!(guard.failure(), Some(reason));
        assert_eq!(guard.check(90 << 20, "tm"), MemoryCheck::Within);
        assert_eq!(guard.failure(), None);
    }

    #[test]
    fn this_process_has_a_resident_size() {
        let resident = resident_bytes().expect("/proc/self/status has VmRSS");
        assert!(resident > 1 << 20, "{resident}");
    }
}
