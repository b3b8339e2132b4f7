//! Apache Flink's own tools against weir: Flink 2.3's REST classes read every GET path weir
//! serves (on a running job, a finished one and a standalone cluster with TaskManagers),
//! and the real `flink` CLI lists, checkpoints, savepoints, disposes, stops and cancels weir
//! jobs on a standalone cluster and on the embedded one of `weir run`.
//!
//! Flink's Web Dashboard, served from its distribution in front of weir's REST API and
//! rendered in headless Chromium, shows each vertex's busy and backpressured time.
//!
//! All need Apache Flink's distribution from PyPI (`apache-flink` and
//! `apache-flink-libraries`, which `.ci/test` installs) at `WEIR_FLINK_HOME`, and Java 17.

#[path = "common/browser.rs"]
mod browser;
mod common;
use common::BoundedOutput;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{RunningWeir, WAIT_MAX, get, poll_json, run_weir, start_running};

const INSTALL: &str = "run the tests with `.ci/test`, which installs Apache Flink 2.3's CLI from PyPI \
     (`.ci/venv/bin/pip install --no-deps apache-flink==2.3.0 apache-flink-libraries==2.3.0`) and sets \
     WEIR_FLINK_HOME to its `pyflink` directory; Java 17 (`apt-get install openjdk-17-jre-headless`) runs it";

/// Flink's home (`bin/flink`, `lib/*.jar`), or a failure that says how to install it.
fn flink_home() -> PathBuf {
    let home = std::env::var_os("WEIR_FLINK_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("WEIR_FLINK_HOME is not set: {INSTALL}"));
    assert!(home.join("bin/flink").is_file(), "{} has no bin/flink: {INSTALL}", home.display());
    assert!(
        home.join("lib/flink-dist-2.3.0.jar").is_file(),
        "{} has no lib/flink-dist-2.3.0.jar: {INSTALL}",
        home.display()
    );
    let java = Command::new("java").arg("-version").stderr(Stdio::null()).status();
    assert!(java.is_ok_and(|s| s.success()), "no `java` on PATH: {INSTALL}");
    home
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Runs Flink's schema checker (tests/flink/FlinkRestConformance.java) against `rest`.
fn assert_conforms(home: &Path, rest: &str, label: &str, args: &[String]) {
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/flink/FlinkRestConformance.java");
    let output = Command::new("java")
        .arg("-cp")
        .arg(format!("{}/lib/*", home.display()))
        .arg(&checker)
        .arg(rest)
        .arg(label)
        .args(args)
        .stdin(Stdio::null())
        .bounded_output()
        .expect("java runs");
    let report = text(&output);
    assert!(output.status.success(), "weir's answers do not fit Flink's schema ({label}):\n{report}");
    assert!(report.contains(&format!("CONFORMS {label}")), "{report}");
    // The checker covers every path weir serves that Flink has: at least the ones a job page,
    // `flink list` and the metrics and checkpoint views read.
    let checked: u32 = report
        .lines()
        .find_map(|l| l.strip_prefix("checked ").and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(checked >= 45, "only {checked} paths checked:\n{report}");
}

/// `flink ARGS -m REST` with Flink's CLI, bounded in time.
fn flink(home: &Path, rest: &str, args: &[&str]) -> Output {
    let address = rest.trim_start_matches("http://");
    let mut command = Command::new("bash");
    command
        .arg(home.join("bin/flink"))
        .args(args.iter().take(1))
        .args(["-m", address])
        .args(args.iter().skip(1))
        .env("FLINK_HOME", home)
        .env("FLINK_CONF_DIR", home.join("conf"));
    let (output, ended) = common::output_within(command, Duration::from_secs(90));
    assert!(ended, "flink {args:?} did not end in 90 s: {}", text(&output));
    output
}

/// The first vertex id and the newest checkpoint id of `job` (waiting for a checkpoint).
fn vertex_and_checkpoint(rest: &str, job: &str) -> (String, String) {
    let details = get(&format!("{rest}/jobs/{job}")).json();
    let vertex = details["vertices"][0]["id"].as_str().unwrap().to_string();
    let checkpoints =
        poll_json(&format!("{rest}/jobs/{job}/checkpoints"), |c| c["counts"]["completed"].as_u64() > Some(0));
    let checkpoint = checkpoints["latest"]["completed"]["id"].to_string();
    (vertex, checkpoint)
}

fn post_json(url: &str, body: serde_json::Value) -> serde_json::Value {
    let mut response = ureq::post(url).send_json(body).unwrap_or_else(|e| panic!("POST {url}: {e}"));
    response.body_mut().read_json().unwrap()
}

/// Path parameters for the checker: the ids of `job` on `rest`, a savepoint trigger and a
/// disposal trigger.
fn checker_args(rest: &str, job: &str, taskmanager: &str, dir: &Path) -> Vec<String> {
    let (vertex, _) = vertex_and_checkpoint(rest, job);
    let mut args = vec![
        format!("jobid={job}"),
        format!("applicationid={job}"),
        format!("vertexid={vertex}"),
        format!("taskmanagerid={taskmanager}"),
        "subtaskindex=0".to_string(),
        format!("attempt={}", get(&format!("{rest}/jobs/{job}/vertices/{vertex}/subtasks/0")).json()["attempt"]),
    ];
    let state = get(&format!("{rest}/jobs/{job}/status")).json()["status"].as_str().unwrap().to_string();
    if state == "RUNNING" {
        let target = dir.join("savepoints");
        let trigger = post_json(
            &format!("{rest}/jobs/{job}/savepoints"),
            serde_json::json!({"target-directory": target.to_str().unwrap()}),
        );
        let trigger = trigger["request-id"].as_str().unwrap().to_string();
        let done = poll_json(&format!("{rest}/jobs/{job}/savepoints/{trigger}"), |s| s["status"]["id"] == "COMPLETED");
        args.push(format!("/jobs/:jobid/savepoints/:triggerid=/jobs/{job}/savepoints/{trigger}"));
        let location = done["operation"]["location"].as_str().unwrap().to_string();
        let disposal =
            post_json(&format!("{rest}/savepoint-disposal"), serde_json::json!({"savepoint-path": location}));
        let disposal = disposal["request-id"].as_str().unwrap().to_string();
        poll_json(&format!("{rest}/savepoint-disposal/{disposal}"), |s| s["status"]["id"] == "COMPLETED");
        args.push(format!("/savepoint-disposal/:triggerid=/savepoint-disposal/{disposal}"));
        let checkpoint = post_json(&format!("{rest}/jobs/{job}/checkpoints"), serde_json::json!({}));
        let checkpoint = checkpoint["request-id"].as_str().unwrap().to_string();
        poll_json(&format!("{rest}/jobs/{job}/checkpoints/{checkpoint}"), |s| s["status"]["id"] == "COMPLETED");
        args.push(format!("/jobs/:jobid/checkpoints/:triggerid=/jobs/{job}/checkpoints/{checkpoint}"));
    } else {
        // A job that ended has no savepoint or checkpoint triggers; the running jobs' runs
        // check them.
        args.push("/jobs/:jobid/savepoints/:triggerid=SKIP".to_string());
        args.push("/savepoint-disposal/:triggerid=SKIP".to_string());
        args.push("/jobs/:jobid/checkpoints/:triggerid=SKIP".to_string());
    }
    // Last, so that it is still in the history (the newest 10) while the checker runs.
    let (_, checkpoint) = vertex_and_checkpoint(rest, job);
    args.push(format!("checkpointid={checkpoint}"));
    args
}

/// A JobManager with two TaskManagers in the background; ended when dropped.
struct Cluster {
    rest: String,
    taskmanager: String,
    _processes: Vec<RunningWeir>,
}

fn start_cluster() -> Cluster {
    let mut jobmanager = RunningWeir::start(&["jobmanager", "-D", "rest.port=0", "-D", "jobmanager.rpc.port=0"]);
    let line = jobmanager.stderr_line("REST API at http://");
    let rest = line.split("REST API at ").nth(1).unwrap().split(',').next().unwrap().to_string();
    let rpc = line.rsplit("connect to ").next().unwrap().trim().to_string();
    let mut processes = vec![jobmanager];
    for _ in 0..2 {
        let mut taskmanager =
            RunningWeir::start(&["taskmanager", "--jobmanager", &rpc, "-D", "taskmanager.numberOfTaskSlots=2"]);
        taskmanager.stderr_line("registered at");
        processes.push(taskmanager);
    }
    let overview =
        poll_json(&format!("{rest}/taskmanagers"), |t| t["taskmanagers"].as_array().is_some_and(|l| l.len() == 2));
    let taskmanager = overview["taskmanagers"][0]["id"].as_str().unwrap().to_string();
    Cluster { rest, taskmanager, _processes: processes }
}

/// Submits an unbounded counter with checkpoints every 300 ms to `rest`, detached.
fn submit_running(rest: &str, name_args: &[&str]) -> String {
    let mut args = vec!["run", "-d", "-m", rest.trim_start_matches("http://"), "-p", "2"];
    args.extend(["-D", "execution.checkpointing.interval=4s"]);
    args.extend(name_args);
    let run = run_weir(&args);
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "{}", text(&run));
    let job = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Job has been submitted with JobID "))
        .unwrap_or_else(|| panic!("{stdout}"));
    let job = job.trim().to_string();
    poll_json(&format!("{rest}/jobs/{job}"), |j| j["state"] == "RUNNING");
    job
}

#[test]
fn flinks_rest_classes_read_every_path_weir_serves() {
    let home = flink_home();
    let dir = tempfile::tempdir().unwrap();

    // A running job on the embedded cluster, with checkpoints.
    let checkpoints = format!("file://{}", dir.path().join("checkpoints").display());
    let (mut embedded, rest, job) = start_running(&[
        "run",
        "-p",
        "2",
        "-D",
        "rest.port=0",
        "-D",
        "execution.checkpointing.interval=4s",
        "-D",
        &format!("state.checkpoints.dir={checkpoints}"),
        "counter",
        "--users",
        "100",
        "--rate",
        "2000",
        "--output",
        "none",
    ]);
    let args = checker_args(&rest, &job, "embedded", dir.path());
    assert_conforms(&home, &rest, "embedded-running", &args);
    embedded.kill_hard();

    // A standalone cluster with TaskManagers: a running job, and one that finished.
    let cluster = start_cluster();
    let running = submit_running(&cluster.rest, &["counter", "--users", "100", "--rate", "2000", "--output", "none"]);
    let args = checker_args(&cluster.rest, &running, &cluster.taskmanager, dir.path());
    assert_conforms(&home, &cluster.rest, "cluster-running", &args);
    let finished = run_weir(&[
        "run",
        "-m",
        cluster.rest.trim_start_matches("http://"),
        "-D",
        "execution.checkpointing.interval=100ms",
        "counter",
        "--users",
        "10",
        "--events",
        "200000",
        "--rate",
        "200000",
        "--output",
        "none",
    ]);
    let stdout = String::from_utf8_lossy(&finished.stdout).to_string();
    assert!(finished.status.success() && stdout.contains("ended with state FINISHED"), "{}", text(&finished));
    let finished_job = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Job has been submitted with JobID "))
        .map(|id| id.trim().to_string())
        .unwrap_or_else(|| panic!("{stdout}"));
    let args = checker_args(&cluster.rest, &finished_job, &cluster.taskmanager, dir.path());
    assert_conforms(&home, &cluster.rest, "cluster-finished", &args);
}

/// `flink list` output: the job ids under the section that starts with `heading`.
fn listed(output: &str, heading: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut inside = false;
    for line in output.lines() {
        if line.contains("---") && line.contains(heading) {
            inside = true;
        } else if inside && line.starts_with("---") {
            inside = false;
        } else if let Some(id) = line.split(" : ").nth(1).filter(|_| inside) {
            ids.push(id.trim().to_string());
        }
    }
    ids
}

/// Flink's CLI against one cluster: list, checkpoint, savepoint, dispose, stop with a
/// savepoint path, cancel, list all.
fn flink_cli_round(home: &Path, rest: &str, running: &str, to_cancel: &str, dir: &Path) {
    let list = flink(home, rest, &["list"]);
    let out = text(&list);
    assert!(list.status.success(), "{out}");
    let shown = listed(&out, "Running/Restarting Jobs");
    assert!(shown.contains(&running.to_string()) && shown.contains(&to_cancel.to_string()), "{out}");
    assert!(out.contains("No scheduled jobs."), "{out}");
    let list = flink(home, rest, &["list", "-r"]);
    assert!(listed(&text(&list), "Running/Restarting Jobs").contains(&running.to_string()), "{}", text(&list));
    let scheduled = flink(home, rest, &["list", "-s"]);
    assert!(scheduled.status.success() && text(&scheduled).contains("No scheduled jobs."), "{}", text(&scheduled));

    // A savepoint, then its disposal.
    let target = dir.join("flink-savepoints");
    let savepoint = flink(home, rest, &["savepoint", running, target.to_str().unwrap()]);
    let out = text(&savepoint);
    assert!(savepoint.status.success(), "{out}");
    let location = out
        .lines()
        .find_map(|l| l.strip_prefix("Savepoint completed. Path: "))
        .unwrap_or_else(|| panic!("{out}"))
        .trim()
        .to_string();
    let on_disk = PathBuf::from(location.trim_start_matches("file://"));
    assert!(on_disk.join("_metadata").is_file(), "{out}");
    let dispose = flink(home, rest, &["savepoint", "-d", &location]);
    let out = text(&dispose);
    assert!(dispose.status.success() && out.contains("Savepoint '") && out.contains("disposed"), "{out}");
    assert!(!on_disk.join("_metadata").exists(), "flink savepoint -d left {}", on_disk.display());

    // A checkpoint now (Flink 1.19's `flink checkpoint`), and a full one.
    let checkpoint = flink(home, rest, &["checkpoint", running]);
    let out = text(&checkpoint);
    assert!(checkpoint.status.success(), "{out}");
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("Checkpoint ").and_then(|r| r.split(' ').next()))
        .and_then(|id| id.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(out.contains(&format!("Checkpoint {id} for job {running} completed.")), "{out}");
    let details = get(&format!("{rest}/jobs/{running}/checkpoints/details/{id}")).json();
    assert_eq!(details["status"], "COMPLETED", "{details}");
    assert_eq!(details["is_savepoint"], false, "{details}");
    // Each subtask's parts as Flink's web UI shows them: the delay until its first barrier,
    // the alignment, the synchronous and asynchronous parts, all within its end-to-end time.
    let vertex = details["tasks"].as_object().and_then(|tasks| tasks.keys().next().cloned()).expect("a vertex");
    let parts = get(&format!("{rest}/jobs/{running}/checkpoints/details/{id}/subtasks/{vertex}")).json();
    let subtasks = parts["subtasks"].as_array().unwrap_or_else(|| panic!("{parts}"));
    assert!(!subtasks.is_empty(), "{parts}");
    for subtask in subtasks {
        let ms = |value: &serde_json::Value| value.as_u64().unwrap_or_else(|| panic!("{subtask}"));
        let timed = ms(&subtask["start_delay"])
            + ms(&subtask["alignment"]["duration"])
            + ms(&subtask["checkpoint"]["sync"])
            + ms(&subtask["checkpoint"]["async"]);
        // Each part is rounded down to a millisecond on its own.
        assert!(timed <= ms(&subtask["end_to_end_duration"]) + 4, "{subtask}");
    }
    let full = flink(home, rest, &["checkpoint", "-full", running]);
    assert!(full.status.success() && text(&full).contains("Checkpoint(FULL) "), "{}", text(&full));

    // Stop with a savepoint into a given directory, draining (the final watermark first):
    // the job ends FINISHED, the savepoint is there.
    let stop_target = dir.join("flink-stop");
    let stop = flink(home, rest, &["stop", "--drain", "--savepointPath", stop_target.to_str().unwrap(), running]);
    let out = text(&stop);
    assert!(stop.status.success(), "{out}");
    let stopped_at = out
        .lines()
        .find_map(|l| l.strip_prefix("Savepoint completed. Path: "))
        .unwrap_or_else(|| panic!("{out}"))
        .trim()
        .to_string();
    assert!(PathBuf::from(stopped_at.trim_start_matches("file://")).join("_metadata").is_file(), "{out}");
    poll_json(&format!("{rest}/jobs/{running}"), |j| j["state"] == "FINISHED");

    // Cancel.
    let cancel = flink(home, rest, &["cancel", to_cancel]);
    let out = text(&cancel);
    assert!(cancel.status.success() && out.contains(&format!("Cancelled job {to_cancel}.")), "{out}");
    poll_json(&format!("{rest}/jobs/{to_cancel}"), |j| j["state"] == "CANCELED");

    // All jobs: both ended ones are listed as terminated.
    let all = flink(home, rest, &["list", "-a"]);
    let out = text(&all);
    assert!(all.status.success(), "{out}");
    let terminated = listed(&out, "Terminated Jobs");
    assert!(terminated.contains(&running.to_string()) && terminated.contains(&to_cancel.to_string()), "{out}");
    assert!(out.contains(&format!("{running} : counter (FINISHED)")), "{out}");
    assert!(out.contains(&format!("{to_cancel} : counter (CANCELED)")), "{out}");
}

#[test]
fn the_flink_cli_lists_checkpoints_savepoints_disposes_stops_and_cancels() {
    let home = flink_home();
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster();
    let job_args = ["counter", "--users", "50", "--rate", "1000", "--output", "none"];
    let running = submit_running(&cluster.rest, &job_args);
    let to_cancel = submit_running(&cluster.rest, &job_args);
    flink_cli_round(&home, &cluster.rest, &running, &to_cancel, dir.path());

    // The embedded cluster: `weir run` serves one job. Flink's CLI lists it, savepoints it,
    // disposes that savepoint and cancels it; a second `weir run` is stopped with a savepoint
    // (without drain), which ends it.
    let embedded_args = ["run", "-D", "rest.port=0", "counter", "--users", "50", "--rate", "1000", "--output", "none"];
    let (mut embedded, rest, job) = start_running(&embedded_args);
    let (mut to_stop, stop_rest, stop_job) = start_running(&embedded_args);
    for args in [&["list"][..], &["list", "-r"], &["list", "-a"]] {
        let list = flink(&home, &rest, args);
        let out = text(&list);
        assert!(list.status.success() && listed(&out, "Running/Restarting Jobs").contains(&job), "{args:?}: {out}");
    }
    let target = dir.path().join("embedded-savepoints");
    let savepoint = flink(&home, &rest, &["savepoint", &job, target.to_str().unwrap()]);
    let out = text(&savepoint);
    assert!(savepoint.status.success(), "{out}");
    let location = out
        .lines()
        .find_map(|l| l.strip_prefix("Savepoint completed. Path: "))
        .unwrap_or_else(|| panic!("{out}"))
        .trim()
        .to_string();
    let on_disk = PathBuf::from(location.trim_start_matches("file://"));
    assert!(on_disk.join("_metadata").is_file(), "{out}");
    let dispose = flink(&home, &rest, &["savepoint", "-d", &location]);
    let out = text(&dispose);
    assert!(dispose.status.success() && out.contains("disposed"), "{out}");
    assert!(!on_disk.join("_metadata").exists(), "flink savepoint -d left {}", on_disk.display());
    let cancel = flink(&home, &rest, &["cancel", &job]);
    assert!(cancel.status.success() && text(&cancel).contains(&format!("Cancelled job {job}.")), "{}", text(&cancel));
    let deadline = Instant::now() + WAIT_MAX;
    while !embedded.exited() {
        assert!(Instant::now() < deadline, "weir run did not end after flink cancel");
        std::thread::sleep(Duration::from_millis(50));
    }

    let stop_target = dir.path().join("embedded-stop");
    let stop = flink(&home, &stop_rest, &["stop", "--savepointPath", stop_target.to_str().unwrap(), &stop_job]);
    let out = text(&stop);
    assert!(stop.status.success(), "{out}");
    let stopped_at = out
        .lines()
        .find_map(|l| l.strip_prefix("Savepoint completed. Path: "))
        .unwrap_or_else(|| panic!("{out}"))
        .trim()
        .to_string();
    assert!(PathBuf::from(stopped_at.trim_start_matches("file://")).join("_metadata").is_file(), "{out}");
    assert_eq!(to_stop.wait(), Some(0), "weir run ends after flink stop: {:?}", to_stop.stdout_lines());
    let stdout = to_stop.stdout_lines().join("\n");
    assert!(stdout.contains("ended with state FINISHED"), "{stdout}");
}

/// Flink's Web Dashboard, its own files from Flink's distribution in front of weir's REST
/// API, rendered in Chromium: every vertex of a running job shows its busy and
/// backpressured time (Flink's `busyTimeMsPerSecond` and `backPressuredTimeMsPerSecond`,
/// the maximum over its subtasks), not "N/A".
#[test]
fn flinks_dashboard_shows_the_busy_and_backpressured_time_of_weirs_vertices() {
    let home = flink_home();
    let (mut run, rest, job) = start_running(&[
        "run",
        "-D",
        "rest.port=0",
        "-p",
        "2",
        "counter",
        "--users",
        "100",
        "--rate",
        "20000",
        "--output",
        "none",
    ]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/flink/dashboard.py");
    let mut dashboard = common::KilledOnDrop(
        Command::new("python3")
            .arg(&script)
            .arg(home.join("lib/flink-dist-2.3.0.jar"))
            .arg(&rest)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the dashboard's server"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + WAIT_MAX;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the dashboard's server did not answer");
        assert!(dashboard.0.try_wait().unwrap().is_none(), "the dashboard's server exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every vertex has its time split once its subtasks ran a second (before, Flink's
    // dashboard shows N/A, as Flink's own does for a job that just started).
    let details = get(&format!("{rest}/jobs/{job}")).json();
    for vertex in details["vertices"].as_array().unwrap() {
        let query = format!(
            "{rest}/jobs/{job}/vertices/{}/subtasks/metrics?get=busyTimeMsPerSecond,backPressuredTimeMsPerSecond",
            vertex["id"].as_str().unwrap()
        );
        poll_json(&query, |metrics| metrics.as_array().is_some_and(|m| m.len() == 2));
    }
    // The dashboard draws the graph after the job's details arrive, each node with N/A
    // first, filled in when that vertex's metric request returns; on a loaded machine the
    // page can be dumped before the graph or in between (with Chromium's 4 s virtual time
    // budget, half the dumps on 2026-12-07; with 10 s, none of 4), so the page gets 10 s and
    // such a page is rendered again (weir not serving the values shows N/A every time).
    let overview = format!("{url}/#/job/running/{job}/overview");
    let mut pages = Vec::new();
    for _ in 0..3 {
        let page = browser::headless_with_budget(&overview, 10_000, &["--dump-dom"]);
        let shown = |label: &str| page.matches(label).count();
        let drawn = shown("Busy (max): ") == 2 && shown("Backpressured (max): ") == 2;
        if drawn && !page.contains("Busy (max): N/A") && !page.contains("Backpressured (max): N/A") {
            run.kill_hard();
            return;
        }
        pages.push(page);
    }
    let values = |page: &String| -> Vec<String> {
        page.match_indices(" (max): ").map(|(at, _)| page[at..].chars().take_while(|c| *c != '<').collect()).collect()
    };
    let shown: Vec<Vec<String>> = pages.iter().map(values).collect();
    panic!(
        "Flink's dashboard did not show both vertices' busy and backpressured time in any rendering (each rendering's values: {shown:?}); the last:\n{}",
        pages[pages.len() - 1]
    );
}
