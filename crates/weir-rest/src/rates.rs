//! Per-second values of a subtask's counters, as Flink's meters and time gauges
//! (`numRecordsInPerSecond`, `busyTimeMsPerSecond`, ...): each counter's readings at the
//! last two scrapes or queries at least a second apart, shared by `/metrics` and the REST
//! metric queries Flink's dashboard makes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use weir_runtime::status::VertexMetrics;

/// The shortest window a per-second backpressure value is measured over, and the
/// longest (older readings are forgotten).
pub(crate) const RATE_WINDOW_MIN: Duration = Duration::from_secs(1);
pub(crate) const RATE_WINDOW_MAX: Duration = Duration::from_secs(300);

/// One attempt of one subtask: job id, vertex id, subtask index, when it was created.
pub(crate) type SubtaskKey = (String, String, u32, u64);

/// One counter of one subtask attempt: `backPressuredTimeMs`, `numRecordsIn`,
/// `numRecordsOut`, or `<operator position>.numRecordsIn` / `.numRecordsOut`.
pub(crate) type CounterKey = (SubtaskKey, String);

/// A counter's value at the latest scrape at least [`RATE_WINDOW_MIN`] after the one
/// before, and at that one before.
pub(crate) struct Readings {
    pub(crate) newest: (Instant, u64),
    pub(crate) before: Option<(Instant, u64)>,
}

/// Readings by subtask attempt, of every REST server of this process (keys carry job
/// ids, so servers never share one).
pub(crate) static READINGS: Mutex<BTreeMap<CounterKey, Readings>> = Mutex::new(BTreeMap::new());

/// How fast the counter `key` grew per second since an earlier scrape (at least
/// [`RATE_WINDOW_MIN`] ago); `None` at its first scrape, or when it shrank (another
/// attempt's).
pub(crate) fn per_second(key: CounterKey, now: Instant, count: u64) -> Option<f64> {
    let mut readings = READINGS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let base = match readings.get_mut(&key) {
        None => {
            readings.insert(key, Readings { newest: (now, count), before: None });
            return None;
        }
        Some(entry) if now.saturating_duration_since(entry.newest.0) >= RATE_WINDOW_MIN => {
            let base = entry.newest;
            *entry = Readings { newest: (now, count), before: Some(base) };
            base
        }
        Some(entry) => entry.before?,
    };
    let window = now.saturating_duration_since(base.0);
    if window < RATE_WINDOW_MIN || window > RATE_WINDOW_MAX || count < base.1 {
        return None;
    }
    Some((count - base.1) as f64 / window.as_secs_f64())
}

/// Milliseconds per second a subtask spent working, waiting for input and blocked on
/// output: Flink's `busyTimeMsPerSecond`, `idleTimeMsPerSecond` and
/// `backPressuredTimeMsPerSecond`, which add up to 1000.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimePerSecond {
    pub busy: i64,
    pub idle: i64,
    pub backpressured: i64,
}

/// The time split of subtask `key` with counters `io`: over the time since a reading at
/// least a second before, else (the first reading) over its whole time running; `None`
/// before it ran a second.
pub(crate) fn time_per_second(key: &SubtaskKey, now: Instant, io: &VertexMetrics) -> Option<TimePerSecond> {
    let idle_ms = io.accumulated_idle_time;
    let backpressured_ms = io.backpressured_ms;
    let windowed = (
        per_second((key.clone(), "idleTimeMs".to_string()), now, idle_ms),
        per_second((key.clone(), "backPressuredTimeMs".to_string()), now, backpressured_ms),
    );
    let (idle, backpressured) = match windowed {
        (Some(idle), Some(backpressured)) => (idle, backpressured),
        _ => {
            let running = idle_ms as f64 + backpressured_ms as f64 + io.accumulated_busy_time;
            if running < 1000.0 {
                return None;
            }
            (idle_ms as f64 * 1000.0 / running, backpressured_ms as f64 * 1000.0 / running)
        }
    };
    let idle = idle.round().clamp(0.0, 1000.0) as i64;
    let backpressured = (backpressured.round().clamp(0.0, 1000.0) as i64).min(1000 - idle);
    Some(TimePerSecond { busy: 1000 - idle - backpressured, idle, backpressured })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use weir_runtime::status::VertexMetrics;

    use super::{TimePerSecond, per_second, time_per_second};

    #[test]
    fn a_rate_is_over_at_least_a_second() {
        let key = (("job".to_string(), "vertex".to_string(), 0, 1), "backPressuredTimeMs".to_string());
        let start = Instant::now();
        assert_eq!(per_second(key.clone(), start, 100), None, "one reading is no rate");
        assert_eq!(per_second(key.clone(), start + Duration::from_millis(300), 200), None);
        let two = start + Duration::from_secs(2);
        assert_eq!(per_second(key.clone(), two, 1100), Some(500.0), "1000 ms blocked in 2 s");
        // Soon after: still measured against the reading a second or more before.
        assert_eq!(per_second(key.clone(), two + Duration::from_millis(500), 1100), Some(400.0));
        // A smaller count than before is another attempt's: no rate from it.
        assert_eq!(per_second(key, two + Duration::from_secs(3), 0), None);
    }

    #[test]
    fn the_time_split_adds_up_to_a_second_first_over_the_lifetime_then_over_the_window() {
        let key = ("time-split-job".to_string(), "v".to_string(), 0, 1);
        let start = Instant::now();
        // 500 ms running: too short for a value.
        let young = VertexMetrics::of(0, 0, 100).with_time(300, 100);
        let young_key = ("time-split-job".to_string(), "v".to_string(), 1, 1);
        assert_eq!(time_per_second(&young_key, start, &young), None);
        // First read after 10 s running: 6 s idle, 1 s blocked, 3 s busy.
        let first = VertexMetrics::of(0, 0, 1000).with_time(6000, 3000);
        let split = time_per_second(&key, start, &first);
        assert_eq!(split, Some(TimePerSecond { busy: 300, idle: 600, backpressured: 100 }));
        // 2 s later: 2 s more blocked on output, nothing idle.
        let later = VertexMetrics::of(0, 0, 3000).with_time(6000, 3000);
        let split = time_per_second(&key, start + Duration::from_secs(2), &later);
        assert_eq!(split, Some(TimePerSecond { busy: 0, idle: 0, backpressured: 1000 }));
    }
}
