//! The example binary runs its own job and the built-in ones, and a failing user function
//! ends the job FAILED with the function's error.

use std::process::Command;

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
        .output()
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
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("ended with state FAILED"), "{stdout}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("FAILED") && errors[0].contains("'hot' is not a temperature"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_custom_binary_lists_its_own_and_the_builtin_jobs() {
    let output = my_weir().arg("jobs").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    for name in ["sensor-stats", "counter", "wordcount"] {
        assert!(stdout.contains(name), "{stdout}");
    }
}
