//! A running embedded job seen and cancelled over REST and with `weir cancel`.

mod common;

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
