//! Part-file names: the only place they are built and parsed.
//!
//! A committed part is `part-<job>-<attempt>-<subtask>-<counter>`: `<job>` is the job id (32
//! lowercase hex; 8 in files of weir before 0.2), `<attempt>` the deploy that wrote it (a
//! restart never reuses a name), then the subtask and its part counter. While it is written
//! it is `.<committed>.inprogress`, and between its checkpoint's barrier and that checkpoint's
//! completion `.<committed>.pending`. The leading dot hides both from readers.

/// The parts of a part file's name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PartName {
    /// The job id that wrote it (32 hex, or 8 in older names).
    pub job: String,
    /// The deploy (attempt) of that job.
    pub attempt: u32,
    /// The subtask.
    pub subtask: u32,
    /// The subtask's part counter.
    pub counter: u64,
}

/// Where a hidden part file stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenKind {
    /// Being written.
    InProgress,
    /// Closed at a barrier, waiting for its checkpoint to complete.
    Pending,
}

const COMMITTED_PREFIX: &str = "part-";
const IN_PROGRESS_SUFFIX: &str = ".inprogress";
const PENDING_SUFFIX: &str = ".pending";

impl PartName {
    /// The committed (visible) name.
    pub fn committed(&self) -> String {
        format!("{COMMITTED_PREFIX}{}-{}-{}-{}", self.job, self.attempt, self.subtask, self.counter)
    }

    /// The name while it is written.
    pub fn in_progress(&self) -> String {
        format!(".{}{IN_PROGRESS_SUFFIX}", self.committed())
    }

    /// The name while its checkpoint completes.
    pub fn pending(&self) -> String {
        format!(".{}{PENDING_SUFFIX}", self.committed())
    }

    /// Parses a committed name; `None` for anything this sink does not write.
    pub fn parse_committed(name: &str) -> Option<PartName> {
        let rest = name.strip_prefix(COMMITTED_PREFIX)?;
        let mut fields = rest.split('-');
        let job = fields.next()?;
        let attempt = decimal(fields.next()?)?;
        let subtask = decimal(fields.next()?)?;
        let counter = decimal(fields.next()?)?;
        if fields.next().is_some() || !is_job_hex(job) {
            return None;
        }
        Some(PartName {
            job: job.to_string(),
            attempt: u32::try_from(attempt).ok()?,
            subtask: u32::try_from(subtask).ok()?,
            counter,
        })
    }

    /// Parses a hidden (in-progress or pending) name.
    pub fn parse_hidden(name: &str) -> Option<(PartName, HiddenKind)> {
        let inner = name.strip_prefix('.')?;
        if let Some(committed) = inner.strip_suffix(IN_PROGRESS_SUFFIX) {
            return Some((PartName::parse_committed(committed)?, HiddenKind::InProgress));
        }
        let committed = inner.strip_suffix(PENDING_SUFFIX)?;
        Some((PartName::parse_committed(committed)?, HiddenKind::Pending))
    }

    /// True when this part was written by job `job_id` (32 hex): older names carry only its
    /// first 8 digits.
    pub fn written_by(&self, job_id: &str) -> bool {
        self.job == job_id || (self.job.len() == 8 && job_id.len() == 32 && job_id.starts_with(&self.job))
    }
}

/// The hidden file a subtask writes when a savepoint's barrier passes it while it has staged
/// parts: `.savepoint-<job>-<attempt>-<subtask>-<checkpoint id>.parts`, one committed part name
/// per line. The savepoint names those parts and only its own restore commits them (an
/// intermediate savepoint commits nothing), so a failover that goes back to an older
/// checkpoint must keep them; the writer removes the file once the parts are committed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SavepointMarker {
    /// The job id that wrote it.
    pub job: String,
    /// The deploy (attempt) of that job.
    pub attempt: u32,
    /// The subtask.
    pub subtask: u32,
    /// The savepoint's checkpoint id.
    pub checkpoint_id: u64,
}

const MARKER_PREFIX: &str = ".savepoint-";
const MARKER_SUFFIX: &str = ".parts";

impl SavepointMarker {
    /// Its file name.
    pub fn file_name(&self) -> String {
        format!("{MARKER_PREFIX}{}-{}-{}-{}{MARKER_SUFFIX}", self.job, self.attempt, self.subtask, self.checkpoint_id)
    }

    /// Parses a marker's file name; `None` for anything else.
    pub fn parse(name: &str) -> Option<SavepointMarker> {
        let inner = name.strip_prefix(MARKER_PREFIX)?.strip_suffix(MARKER_SUFFIX)?;
        // The same fields as a committed part name.
        let fields = PartName::parse_committed(&format!("{COMMITTED_PREFIX}{inner}"))?;
        Some(SavepointMarker {
            job: fields.job,
            attempt: fields.attempt,
            subtask: fields.subtask,
            checkpoint_id: fields.counter,
        })
    }
}

/// A plain decimal number (digits only, as this sink writes them).
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn is_job_hex(text: &str) -> bool {
    (text.len() == 32 || text.len() == 8) && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_round_trip_and_strangers_are_refused() {
        let name = PartName { job: "0123456789abcdef0123456789abcdef".into(), attempt: 2, subtask: 3, counter: 17 };
        assert_eq!(name.committed(), "part-0123456789abcdef0123456789abcdef-2-3-17");
        assert_eq!(name.pending(), ".part-0123456789abcdef0123456789abcdef-2-3-17.pending");
        assert_eq!(PartName::parse_committed(&name.committed()), Some(name.clone()));
        assert_eq!(PartName::parse_hidden(&name.pending()), Some((name.clone(), HiddenKind::Pending)));
        assert_eq!(PartName::parse_hidden(&name.in_progress()), Some((name.clone(), HiddenKind::InProgress)));
        let old = PartName::parse_committed("part-4f1c2e0d-0-1-5").unwrap();
        assert!(old.written_by("4f1c2e0d99999999999999999999999a"));
        assert!(!old.written_by("4f1c2e0e99999999999999999999999a"));
        for stranger in [
            "part-../../etc/passwd-0-0-0",
            "/etc/passwd",
            "part-0123456789abcdef0123456789abcdef-0-0-0/x",
            "part-0123456789ABCDEF0123456789ABCDEF-0-0-0",
            "part-0123-0-0-0",
            "part-4f1c2e0d-0-0",
            "part-4f1c2e0d-0-0-0-0",
            "part-4f1c2e0d--1-0-0",
            "part-4f1c2e0d-+1-0-0",
            "part-4f1c2e0d-99999999999-0-0",
            "..part-4f1c2e0d-0-0-0.pending",
            "",
        ] {
            assert_eq!(PartName::parse_committed(stranger), None, "{stranger}");
            assert_eq!(PartName::parse_hidden(&format!(".{stranger}.pending")), None, "{stranger}");
        }
    }

    #[test]
    fn savepoint_markers_round_trip() {
        let marker = SavepointMarker {
            job: "0123456789abcdef0123456789abcdef".into(),
            attempt: 1,
            subtask: 2,
            checkpoint_id: 9,
        };
        assert_eq!(marker.file_name(), ".savepoint-0123456789abcdef0123456789abcdef-1-2-9.parts");
        assert_eq!(SavepointMarker::parse(&marker.file_name()), Some(marker));
        for stranger in [".savepoint-x-1-2-9.parts", ".savepoint-0123456789abcdef0123456789abcdef-1-2.parts", "part-1"]
        {
            assert_eq!(SavepointMarker::parse(stranger), None, "{stranger}");
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_accepts_only_what_it_prints(name in ".{0,60}") {
            if let Some(marker) = SavepointMarker::parse(&name) {
                prop_assert_eq!(marker.file_name(), name.clone());
            }
            if let Some(parsed) = PartName::parse_committed(&name) {
                prop_assert_eq!(parsed.committed(), name.clone());
            }
            if let Some((parsed, kind)) = PartName::parse_hidden(&name) {
                let printed = match kind { HiddenKind::Pending => parsed.pending(), HiddenKind::InProgress => parsed.in_progress() };
                prop_assert_eq!(printed, name);
            }
        }
    }
}
