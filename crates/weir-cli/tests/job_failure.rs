//! A job that fails at run time ends FAILED: exit 1, one `error:` line with the cause.

mod common;

use common::{error_lines, run_weir};

fn assert_failed_with(args: &[&str], needles: &[&str]) {
    let output = run_weir(args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    // On stderr when the job's records go to stdout (`--output -`).
    let status_lines = if args.contains(&"-") { &stderr } else { &stdout };
    assert!(status_lines.contains("Job has been submitted with JobID "), "{stdout}\n{stderr}");
    assert!(status_lines.contains("ended with state FAILED"), "{stdout}\n{stderr}");
    let errors = error_lines(&output);
    assert_eq!(errors.len(), 1, "{stderr}");
    for needle in needles {
        assert!(errors[0].contains(needle), "expected '{needle}' in {}", errors[0]);
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn input_that_is_not_utf8_fails_the_job_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("latin1.txt");
    std::fs::write(&input, b"caf\xe9 au lait\n").unwrap();
    assert_failed_with(
        &["run", "-D", "rest.port=0", "wordcount", "--input", input.to_str().unwrap(), "--output", "-"],
        &["FAILED", "latin1.txt", "UTF-8"],
    );
}

#[test]
fn an_output_directory_that_cannot_be_created_fails_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "a file where the output's parent should be").unwrap();
    let output_dir = blocker.join("out");
    assert_failed_with(
        &[
            "run",
            "-D",
            "rest.port=0",
            "counter",
            "--users",
            "2",
            "--events",
            "10",
            "--output",
            output_dir.to_str().unwrap(),
        ],
        &["FAILED", "not-a-dir"],
    );
}
