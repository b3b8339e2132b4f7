//! A running embedded job seen and cancelled over REST and with `weir cancel`.

mod common;
use common::BoundedOutput;

use common::{RunningWeir, get, patch, poll_json, run_weir};

fn start_unbounded_counter() -> (RunningWeir, String, String) {
    let mut weir = RunningWeir::start(&[
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
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    (weir, rest, job_id)
}

#[test]
fn rest_shows_the_running_job_and_cancel_via_patch_ends_it_canceled() {
    let (mut weir, rest, job_id) = start_unbounded_counter();
    let details = poll_json(&format!("{rest}/jobs/{job_id}"), |job| {
        job["state"] == "RUNNING"
            && job["vertices"].as_array().is_some_and(|vs| {
                vs.iter()
                    .all(|v| v["subtasks"].as_array().is_some_and(|ss| ss.iter().all(|s| s["status"] == "RUNNING")))
            })
    });
    assert_eq!(details["jid"], job_id.as_str());
    assert_eq!(details["name"], "counter");
    assert_eq!(details["maxParallelism"], 128);
    let vertices = details["vertices"].as_array().unwrap();
    assert_eq!(vertices.len(), 2, "{details}");
    for vertex in vertices {
        assert_eq!(vertex["parallelism"], 2);
        assert_eq!(vertex["maxParallelism"], 128);
        assert_eq!(vertex["subtasks"].as_array().unwrap().len(), 2);
    }
    for state in ["INITIALIZING", "CREATED", "RUNNING"] {
        assert!(details["timestamps"][state].as_u64().is_some(), "{state}: {details}");
    }

    let overview = get(&format!("{rest}/jobs/overview")).json();
    assert_eq!(overview["jobs"][0]["jid"], job_id.as_str());
    assert_eq!(overview["jobs"][0]["state"], "RUNNING");
    let cluster = get(&format!("{rest}/overview")).json();
    assert_eq!(cluster["jobs-running"], 1);

    let answer = patch(&format!("{rest}/jobs/{job_id}?mode=cancel"));
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(weir.wait(), Some(1), "a cancelled attached run exits 1");
    assert!(weir.stdout_lines().iter().any(|l| l.contains("ended with state CANCELED")), "{:?}", weir.stdout_lines());
}

#[test]
fn weir_list_and_weir_cancel_work_against_the_embedded_cluster() {
    let (mut weir, rest, job_id) = start_unbounded_counter();
    poll_json(&format!("{rest}/jobs/{job_id}"), |job| job["state"] == "RUNNING");
    let address = rest.trim_start_matches("http://").to_string();

    let list = run_weir(&["list", "-m", &address]);
    assert!(list.status.success());
    let stdout = String::from_utf8_lossy(&list.stdout);
    assert!(stdout.contains(&format!("{job_id} : counter (RUNNING)")), "{stdout}");

    let json = run_weir(&["list", "-m", &address, "--json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(parsed["jobs"][0]["jid"], job_id.as_str());

    let cancel = run_weir(&["cancel", "-m", &address, &job_id]);
    let stdout = String::from_utf8_lossy(&cancel.stdout);
    assert!(cancel.status.success(), "{stdout} {}", String::from_utf8_lossy(&cancel.stderr));
    assert!(
        stdout.contains(&format!("Cancelling job {job_id}.")) && stdout.contains(&format!("Cancelled job {job_id}.")),
        "{stdout}"
    );
    assert_eq!(weir.wait(), Some(1));
}

#[test]
fn unknown_job_on_the_cluster_is_a_runtime_error() {
    let (mut weir, rest, job_id) = start_unbounded_counter();
    poll_json(&format!("{rest}/jobs/{job_id}"), |job| job["state"] == "RUNNING");
    let address = rest.trim_start_matches("http://").to_string();
    let output = run_weir(&["cancel", "-m", &address, "0123456789abcdef0123456789abcdef"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not found"), "{stderr}");
    assert_eq!(patch(&format!("{rest}/jobs/{job_id}?mode=cancel")).status, 202);
    assert_eq!(weir.wait(), Some(1));
}

/// Another cluster holds the default REST port 8081 (here a stand-in answering every
/// request with no jobs). A `weir run` takes a free port instead, and `weir list` and `weir
/// stop` without -m do not ask the other cluster about its job: `list` says where the run
/// is, and `stop` finds the job's run and stops it there.
#[test]
fn a_run_whose_rest_port_moved_off_a_taken_8081_is_found_without_m() {
    use std::io::{BufRead as _, Write as _};
    let other = std::net::TcpListener::bind("127.0.0.1:8081")
        .expect("this test plays another cluster on 127.0.0.1:8081, which must be free");
    std::thread::spawn(move || {
        for stream in other.incoming().flatten() {
            let mut reader = std::io::BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let body = r#"{"jobs":[]}"#;
            let _ =
                write!(&stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    let data = tempfile::tempdir().unwrap();
    let env = |mut command: std::process::Command| {
        command.env("WEIR_DATA_DIR", data.path());
        command
    };
    let mut run =
        RunningWeir::start_with(env, &["run", "counter", "--users", "10", "--rate", "100", "--output", "none"]);
    let job = run.job_id();
    let rest = run.rest_url();
    assert!(!rest.ends_with(":8081"), "{rest}");
    let list = env(common::weir()).arg("list").bounded_output().unwrap();
    let stderr = String::from_utf8_lossy(&list.stderr);
    let hint = format!("serves job {job} at {rest}, not here: weir list -m {}", rest.trim_start_matches("http://"));
    assert!(stderr.contains(&hint), "{stderr}");
    let savepoints = data.path().join("savepoints");
    let stop = env(common::weir()).args(["stop", "-p", savepoints.to_str().unwrap(), &job]).bounded_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&stop.stdout), String::from_utf8_lossy(&stop.stderr));
    assert!(stop.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!("Job {job} runs in `weir run`")) && stdout.contains("Savepoint completed"),
        "{stderr}"
    );
    assert_eq!(run.wait(), Some(0), "the run did not end with its stop");
}
