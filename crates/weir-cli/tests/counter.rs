//! `weir run counter`: every user's emitted counts are exactly 1..=n at p = 1, 2 and 4.

mod common;
use common::BoundedOutput;

use std::collections::BTreeMap;

use common::{committed_lines, run_weir};

fn check_counts(lines: &[String], users: u64, events: u64) {
    let mut per_user: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in lines {
        let (user, count) = line.split_once('\t').unwrap_or_else(|| panic!("not user<TAB>count: {line:?}"));
        per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
    }
    assert_eq!(per_user.len() as u64, users);
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        let expected_events = (0..events).filter(|i| i % users == user).count() as u64;
        let expected: Vec<u64> = (1..=expected_events).collect();
        assert_eq!(counts, expected, "user {user}: lost or duplicated counts");
    }
}

#[test]
fn counter_counts_exactly_per_user_at_p1_p2_p4() {
    let dir = tempfile::tempdir().unwrap();
    for p in ["1", "2", "4"] {
        let out = dir.path().join(format!("out-{p}"));
        let output = run_weir(&[
            "run",
            "-D",
            "rest.port=0",
            "-p",
            p,
            "counter",
            "--users",
            "97",
            "--events",
            "50000",
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(output.status.success(), "p={p}: {}", String::from_utf8_lossy(&output.stderr));
        check_counts(&committed_lines(&out), 97, 50_000);
    }
}

#[test]
fn counter_with_enrich_prints_the_same_counts() {
    let output = run_weir(&[
        "run",
        "-D",
        "rest.port=0",
        "-p",
        "2",
        "counter",
        "--users",
        "5",
        "--events",
        "1000",
        "--enrich",
        "--output",
        "-",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<String> = stdout.lines().filter(|l| l.contains('\t')).map(str::to_string).collect();
    check_counts(&lines, 5, 1000);
}

#[test]
fn counter_output_none_discards() {
    let output =
        run_weir(&["run", "-D", "rest.port=0", "counter", "--users", "10", "--events", "10000", "--output", "none"]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.lines().any(|l| l.contains('\t')), "{stdout}");
    assert!(stdout.contains("ended with state FINISHED"));
}

/// `WEIR_LOG_FORMAT=json`: every log line is one JSON object, as a log shipper wants it.
#[test]
fn json_logs_are_one_object_per_line() {
    let output = common::weir()
        .env("WEIR_LOG", "info")
        .env("WEIR_LOG_FORMAT", "json")
        .args(["run", "-D", "rest.port=0", "counter", "--users", "3", "--events", "30", "--output", "none"])
        .bounded_output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let logged: Vec<serde_json::Value> =
        stderr.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!logged.is_empty(), "no JSON log line: {stderr}");
    for line in &logged {
        assert!(line["timestamp"].is_string() && line["level"].is_string() && line["message"].is_string(), "{line}");
    }
    assert!(logged.iter().any(|l| l["message"] == "REST API listening"), "{stderr}");
}

/// A run whose stderr reader went away (`weir run ... 2>&1 | head`) keeps running and
/// checkpointing: a log line that cannot be written is dropped, and no thread dies of it
/// (the logger used to report its write error with `eprintln!`, which panics on that stderr,
/// in the job master's thread: the job stuck, a task spinning).
#[test]
fn a_run_keeps_checkpointing_when_its_stderr_is_closed() {
    use std::io::BufRead as _;
    let mut child = common::KilledOnDrop(
        common::weir()
            .env("WEIR_LOG", "info")
            .args(["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms"])
            .args(["counter", "--users", "3", "--rate", "100", "--output", "none"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = std::io::BufReader::new(child.0.stderr.take().unwrap());
    let mut line = String::new();
    let rest = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "weir ended before its REST address");
        if let Some(url) = line.split("REST API at ").nth(1) {
            break url.trim().to_string();
        }
    };
    // The reader goes away: every later write to stderr fails.
    drop(stderr);
    let jobs = common::poll_json(&format!("{rest}/jobs/overview"), |j| j["jobs"][0]["state"] == "RUNNING");
    let job = jobs["jobs"][0]["jid"].as_str().unwrap().to_string();
    common::poll_json(&format!("{rest}/jobs/{job}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(5));
}
