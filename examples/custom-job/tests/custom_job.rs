//! The example binary runs its own job and the built-in ones, and a failing user function
//! ends the job FAILED with the function's error.

use std::process::Command;

#[path = "../../../crates/weir-cli/tests/common/bounded.rs"]
mod bounded;
use bounded::BoundedOutput;

fn my_weir() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_my-weir"));
    command.env("WEIR_LOG", "off");
    command
}

#[test]
fn the_custom_job_counts_readings_per_sensor() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("readings.csv");
    std::fs::write(&input, "a,1.5\nb,2\na,3\n\na,-1\n").unwrap();
    let output = my_weir()
        .args(["run", "-D", "rest.port=0", "-p", "2", "sensor-stats", "--input"])
        .arg(&input)
        .args(["--output", "-"])
        .bounded_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let mut lines: Vec<&str> = stdout.lines().filter(|l| l.contains('\t')).collect();
    lines.sort();
    assert_eq!(lines, vec!["a\t3", "b\t1"]);
}

#[test]
fn a_malformed_line_fails_the_job_with_the_function_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("readings.csv");
    std::fs::write(&input, "a,1.5\nb,hot\n").unwrap();
    let output = my_weir()
        .args(["run", "-D", "rest.port=0", "sensor-stats", "--input"])
        .arg(&input)
        .args(["--output", "-"])
        .bounded_output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The job's records go to stdout, so its status lines go to stderr.
    assert!(stderr.contains("ended with state FAILED") && !stdout.contains("ended with state"), "{stdout}{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("FAILED") && errors[0].contains("'hot' is not a temperature"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_custom_binary_lists_its_own_and_the_builtin_jobs() {
    let output = my_weir().arg("jobs").bounded_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    for name in ["sensor-stats", "counter", "wordcount"] {
        assert!(stdout.contains(name), "{stdout}");
    }
}

#[test]
fn a_fixed_delay_strategy_restarts_then_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("readings.csv");
    std::fs::write(&input, "a,1.5\nb,hot\n").unwrap();
    let started = std::time::Instant::now();
    let output = my_weir()
        .args([
            "run",
            "-D",
            "rest.port=0",
            "-D",
            "restart-strategy.type=fixed-delay",
            "-D",
            "restart-strategy.fixed-delay.attempts=2",
            "-D",
            "restart-strategy.fixed-delay.delay=200ms",
            "sensor-stats",
            "--input",
        ])
        .arg(&input)
        .args(["--output", "-"])
        .bounded_output()
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("not restarted") && errors[0].contains("restart-strategy.fixed-delay.attempts"),
        "{stderr}"
    );
    // Two restarts, each after the configured 200 ms.
    assert!(elapsed >= std::time::Duration::from_millis(400), "{elapsed:?}");
}

/// Runs `flaky-counter` (crash once at event 12000, checkpoints every 100 ms) with extra
/// `-D` settings; `steady` adds its unconnected second pipeline writing there.
fn run_flaky_counter(dir: &std::path::Path, extra: &[&str], steady: Option<&std::path::Path>) {
    run_flaky_counter_at(dir, extra, steady, None)
}

/// [`run_flaky_counter`] on the cluster whose REST API is at `cluster`, or embedded.
fn run_flaky_counter_at(
    dir: &std::path::Path,
    extra: &[&str],
    steady: Option<&std::path::Path>,
    cluster: Option<&str>,
) {
    let out = dir.join("out");
    let marker = dir.join("crashed");
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.display());
    let mut command = my_weir();
    command.arg("run");
    if let Some(cluster) = cluster {
        command.args(["-m", cluster]);
    }
    command.args([
        "-D",
        "execution.checkpointing.interval=100ms",
        "-D",
        &checkpoints,
        "-D",
        "restart-strategy.type=fixed-delay",
        "-D",
        "restart-strategy.fixed-delay.attempts=3",
        "-D",
        "restart-strategy.fixed-delay.delay=100ms",
    ]);
    if cluster.is_none() {
        command.args(["-D", "rest.port=0"]);
    }
    for setting in extra {
        command.args(["-D", setting]);
    }
    command.args(["-p", "2", "flaky-counter", "--users", "20", "--events", "20000", "--rate", "10000"]);
    command.args(["--fail-at", "12000", "--marker"]).arg(&marker).arg("--output").arg(&out);
    if let Some(steady) = steady {
        command.arg("--steady-output").arg(steady);
    }
    let output = command.bounded_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(marker.exists(), "the injected crash did not happen");
}

/// Checks that `dir` holds every count 1..=1000 of 20 users exactly once; returns the attempt
/// numbers its part files (`part-<job>-<attempt>-<subtask>-<n>`) were written by.
fn assert_exactly_once_counts(dir: &std::path::Path) -> std::collections::BTreeSet<u32> {
    let mut per_user: std::collections::BTreeMap<u64, Vec<u64>> = std::collections::BTreeMap::new();
    let mut attempts = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        assert!(
            name.starts_with("part-"),
            "left behind: {name} in {:?}",
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>()
        );
        attempts.insert(name.split('-').nth(2).unwrap().parse().unwrap());
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let (user, count) = line.split_once('\t').unwrap();
            per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
        }
    }
    assert_eq!(per_user.len(), 20, "{}", dir.display());
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        assert_eq!(counts, (1..=1000).collect::<Vec<u64>>(), "user {user}: lost or duplicated counts");
    }
    attempts
}

#[test]
fn a_crash_restarts_from_the_latest_checkpoint_and_the_output_stays_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    run_flaky_counter(dir.path(), &[], None);
    assert_exactly_once_counts(&dir.path().join("out"));
}

#[test]
fn region_failover_restarts_only_the_crashed_pipeline_and_full_restarts_both() {
    for (strategy, steady_restarted) in [("region", false), ("full", true)] {
        let dir = tempfile::tempdir().unwrap();
        let steady = dir.path().join("steady");
        let setting = format!("jobmanager.execution.failover-strategy={strategy}");
        run_flaky_counter(dir.path(), &[&setting], Some(&steady));
        // Every deploy (of the job or of one region) has its own attempt number.
        let crashed_attempts = assert_exactly_once_counts(&dir.path().join("out"));
        assert_eq!(crashed_attempts.len(), 2, "{strategy}: the crashed pipeline did not restart");
        let steady_attempts = assert_exactly_once_counts(&steady);
        let expected = if steady_restarted { 2 } else { 1 };
        assert_eq!(steady_attempts.len(), expected, "{strategy}: {steady_attempts:?}");
    }
}

/// A `my-weir` process killed when the test ends.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `my-weir args` and returns it with the first stderr line containing `marker`.
fn spawn_until(args: &[&str], marker: &str) -> (Process, String) {
    use std::io::BufRead;
    let mut child =
        my_weir().args(args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let process = Process(child);
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match received.recv_timeout(left) {
            Ok(line) if line.contains(marker) => return (process, line),
            Ok(_) => {}
            Err(_) => panic!("`my-weir {}` did not print {marker:?}", args.join(" ")),
        }
    }
}

#[test]
fn region_failover_on_a_taskmanager_cluster_restarts_only_the_crashed_pipeline() {
    let (_jobmanager, line) =
        spawn_until(&["jobmanager", "-D", "rest.port=0", "-D", "jobmanager.rpc.port=0"], "REST API at http://");
    let rest = line.split("REST API at http://").nth(1).unwrap().split(',').next().unwrap().to_string();
    let rpc = line.rsplit("connect to ").next().unwrap().trim().to_string();
    // The pipelined regions share the job's slots, as in Flink: two regions at p=2 run in the
    // two slots of two 1-slot TaskManagers.
    let _taskmanagers: Vec<Process> = (0..2)
        .map(|_| {
            spawn_until(
                &["taskmanager", "--jobmanager", &rpc, "-D", "taskmanager.numberOfTaskSlots=1"],
                "registered at",
            )
            .0
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let steady = dir.path().join("steady");
    run_flaky_counter_at(dir.path(), &[], Some(&steady), Some(&rest));
    let crashed_attempts = assert_exactly_once_counts(&dir.path().join("out"));
    assert_eq!(crashed_attempts.len(), 2, "the crashed pipeline did not restart");
    let steady_attempts = assert_exactly_once_counts(&steady);
    assert_eq!(steady_attempts.len(), 1, "the steady pipeline restarted: {steady_attempts:?}");
}

/// The pipelined regions of a job run as attempts of their own on the TaskManagers; the
/// connections of one must never close the other's. Starts a two-region job (the counter
/// and its unconnected steady pipeline, p=2 over two 1-slot TaskManager processes) several
/// times: each finishes without a single failover (no exception, one attempt per output).
#[test]
fn a_multi_region_job_on_a_taskmanager_cluster_starts_without_a_failover() {
    let (_jobmanager, line) =
        spawn_until(&["jobmanager", "-D", "rest.port=0", "-D", "jobmanager.rpc.port=0"], "REST API at http://");
    let rest = line.split("REST API at http://").nth(1).unwrap().split(',').next().unwrap().to_string();
    let rpc = line.rsplit("connect to ").next().unwrap().trim().to_string();
    let _taskmanagers: Vec<Process> = (0..2)
        .map(|_| {
            spawn_until(
                &["taskmanager", "--jobmanager", &rpc, "-D", "taskmanager.numberOfTaskSlots=1"],
                "registered at",
            )
            .0
        })
        .collect();
    const STARTS: usize = 5;
    for start in 0..STARTS {
        let dir = tempfile::tempdir().unwrap();
        let (out, steady) = (dir.path().join("out"), dir.path().join("steady"));
        let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
        let output = my_weir()
            .args(["run", "-m", &rest, "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints])
            .args(["-D", "restart-strategy.type=fixed-delay", "-D", "restart-strategy.fixed-delay.attempts=3"])
            .args(["-p", "2", "flaky-counter", "--users", "20", "--events", "20000", "--rate", "20000"])
            // No crash: the event index that would crash it never comes.
            .args(["--fail-at", "1000000000", "--marker"])
            .arg(dir.path().join("never"))
            .arg("--output")
            .arg(&out)
            .arg("--steady-output")
            .arg(&steady)
            .bounded_output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "start {start}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        let job_id = stdout
            .lines()
            .find_map(|l| l.strip_prefix("Job has been submitted with JobID "))
            .unwrap_or_else(|| panic!("no job id in {stdout}"))
            .trim()
            .to_string();
        let exceptions = http_get(&format!("http://{rest}/jobs/{job_id}/exceptions"));
        let entries = exceptions["exceptionHistory"]["entries"].as_array().cloned().unwrap_or_default();
        assert!(entries.is_empty(), "start {start}: the job failed over: {entries:?}");
        for output in [&out, &steady] {
            let attempts = assert_exactly_once_counts(output);
            assert_eq!(attempts.len(), 1, "start {start}: {} was written by attempts {attempts:?}", output.display());
        }
    }
}

/// `GET url` as JSON.
fn http_get(url: &str) -> serde_json::Value {
    let body = ureq::get(url).call().unwrap().body_mut().read_to_string().unwrap();
    serde_json::from_str(&body).unwrap()
}
