//! Bad input: one `error:` line naming the problem, the documented exit code, no panic.

mod common;
use common::BoundedOutput;

use common::{error_lines, run_weir};

fn assert_usage_error(args: &[&str], needle: &str) {
    let output = run_weir(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    let errors = error_lines(&output);
    assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
    assert!(errors[0].contains(needle), "{args:?}: expected '{needle}' in {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn unknown_job() {
    assert_usage_error(&["run", "nosuchjob"], "unknown job 'nosuchjob'");
}

#[test]
fn missing_input_file() {
    assert_usage_error(
        &["run", "wordcount", "--input", "/nonexistent/input.txt", "--output", "-"],
        "/nonexistent/input.txt",
    );
}

#[test]
fn zero_parallelism() {
    assert_usage_error(&["run", "-p", "0", "counter", "--users", "1"], "parallelism must be between 1 and 32768");
}

#[test]
fn bad_config_value_names_the_key() {
    assert_usage_error(&["run", "-D", "parallelism.default=abc", "counter", "--users", "1"], "parallelism.default");
}

#[test]
fn parallelism_above_max_parallelism_names_both() {
    let output = run_weir(&[
        "run",
        "-p",
        "256",
        "-D",
        "pipeline.max-parallelism=128",
        "counter",
        "--users",
        "1",
        "--events",
        "1",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let errors = error_lines(&output);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("256") && errors[0].contains("128"), "{errors:?}");
}

#[test]
fn unreadable_config_file() {
    assert_usage_error(
        &["run", "-c", "/nonexistent/config.yaml", "counter", "--users", "1"],
        "/nonexistent/config.yaml",
    );
}

#[test]
fn invalid_yaml_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "parallelism.default: [unclosed\n").unwrap();
    assert_usage_error(&["run", "-c", file.to_str().unwrap(), "counter", "--users", "1"], "config.yaml");
}

#[test]
fn bad_value_in_config_file_names_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "execution:\n  checkpointing:\n    interval: soon\n").unwrap();
    let output = run_weir(&["run", "-c", file.to_str().unwrap(), "counter", "--users", "1"]);
    assert_eq!(output.status.code(), Some(2));
    let errors = error_lines(&output);
    assert!(errors[0].contains("execution.checkpointing.interval") && errors[0].contains("config.yaml"), "{errors:?}");
}

/// clap's usage errors as one line that names what is missing, and suggests the command or
/// flag meant.
#[test]
fn usage_errors_name_the_missing_argument_and_suggest_the_one_meant() {
    assert_usage_error(&["run"], "the following required arguments were not provided: <JOB>");
    assert_usage_error(&["deployment", "apply"], "were not provided: --filename <FILE>");
    assert_usage_error(&["cancle"], "unrecognized subcommand 'cancle'; tip: a similar subcommand exists: 'cancel'");
    assert_usage_error(&["run", "--paralelism", "2", "counter"], "tip: a similar argument exists: '--parallelism'");
}

#[test]
fn missing_and_malformed_job_arguments() {
    assert_usage_error(&["run", "counter"], "give --users U (generated events) or --input kafka:");
    assert_usage_error(&["run", "counter", "--users", "many"], "bad value 'many' for --users");
    assert_usage_error(&["run", "counter", "--users", "1", "--colour"], "unknown argument '--colour'");
}

#[test]
fn malformed_job_id_on_cancel() {
    assert_usage_error(&["cancel", "not-a-job-id"], "is not a job id");
}

#[test]
fn cancel_and_list_without_a_cluster_are_runtime_errors() {
    // Port 1 on loopback: nothing listens there.
    for args in
        [vec!["list", "-m", "127.0.0.1:1"], vec!["cancel", "-m", "127.0.0.1:1", "0123456789abcdef0123456789abcdef"]]
    {
        let output = run_weir(&args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let errors = error_lines(&output);
        assert_eq!(errors.len(), 1, "{args:?}");
        assert!(errors[0].contains("cannot reach the JobManager REST API at http://127.0.0.1:1"), "{errors:?}");
    }
}

/// Flink's spellings of the flags parse (a script written for `flink` runs unchanged): the
/// errors are about the missing cluster or snapshot, not about the arguments.
#[test]
fn flink_spellings_of_the_flags_are_accepted() {
    for args in [
        vec!["list", "-m", "127.0.0.1:1", "-r"],
        vec!["list", "-m", "127.0.0.1:1", "-a"],
        vec!["list", "-m", "127.0.0.1:1", "-s"],
        vec!["stop", "-m", "127.0.0.1:1", "--savepointPath", "/tmp/sp", "0123456789abcdef0123456789abcdef"],
    ] {
        let output = run_weir(&args);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        let errors = error_lines(&output);
        assert!(errors[0].contains("cannot reach the JobManager REST API at http://127.0.0.1:1"), "{errors:?}");
    }
    for flag in ["--fromSavepoint", "-s"] {
        let args =
            ["run", "--dry-run", flag, "/nonexistent/savepoint", "--allowNonRestoredState", "counter", "--users", "10"];
        assert_usage_error(&args, "/nonexistent/savepoint");
    }
}

#[test]
fn unknown_verb_is_a_usage_error() {
    let output = run_weir(&["frobnicate"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn jobs_lists_the_catalog_with_arguments() {
    let output = run_weir(&["jobs"]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    for needle in ["counter", "wordcount", "--users U", "--input PATH", "--enrich"] {
        assert!(stdout.contains(needle), "{needle} missing: {stdout}");
    }
}

#[test]
fn completion_scripts_cover_every_verb_and_an_unknown_shell_is_a_usage_error() {
    let output = run_weir(&["completions", "bash"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let script = String::from_utf8_lossy(&output.stdout).to_string();
    for verb in ["run", "list", "cancel", "stop", "savepoint", "jobs", "jobmanager", "taskmanager", "cluster"] {
        assert!(script.contains(verb), "{verb} missing from the bash completions");
    }
    // The script is valid bash.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.bash");
    std::fs::write(&path, &script).unwrap();
    let check = std::process::Command::new("bash").arg("-n").arg(&path).bounded_output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert_usage_error(&["completions", "nushell"], "nushell");
}

/// `weir ... | head -1`: a reader that goes away ends weir quietly, without a panic message.
#[test]
fn a_closed_stdout_ends_weir_without_a_panic() {
    let mut child = common::weir()
        .args(["completions", "bash"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Close the reading end before weir writes (it writes ~10 KB once it started).
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

/// A deployment whose job cannot start (an unknown job, a bad argument) is refused by `weir
/// deployment apply` itself, naming why, and nothing is stored; a good one is stored.
#[test]
fn a_deployment_whose_job_does_not_start_is_refused_at_apply() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let apply = |job: &str, args: &str| {
        let file = dir.path().join("orders.yaml");
        let spec = format!(
            "apiVersion: weir.dev/v1\nkind: WeirDeployment\nmetadata:\n  name: orders\nspec:\n  binary: {}\n  taskManager:\n    replicas: 1\n  job:\n    name: {job}\n    args: [{args}]\n    parallelism: 1\n",
            env!("CARGO_BIN_EXE_weir")
        );
        std::fs::write(&file, spec).unwrap();
        common::weir()
            .env("WEIR_DATA_DIR", &data)
            .args(["deployment", "apply", "-f"])
            .arg(&file)
            .bounded_output()
            .unwrap()
    };
    for (job, args, needle) in
        [("countr", "", "unknown job 'countr'"), ("counter", "--users, abc", "bad value 'abc' for --users")]
    {
        let refused = apply(job, args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("spec.job: the job does not start") && stderr.contains(needle), "{stderr}");
        assert!(stderr.contains("nothing was applied"), "{stderr}");
        assert!(!data.join("deployments/orders/deployment.json").exists(), "a refused spec was stored");
    }
    let applied = apply("counter", "--users, \"10\", --output, none");
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    assert!(data.join("deployments/orders/deployment.json").exists());
}

/// A Flink `config.yaml` brought over: each key weir does not take is warned about with the
/// reason (no JVM, always so, not yet), and the `rest.address` it sets is named as the reason
/// `weir run` submits to a cluster; `-t local` runs the job here instead.
#[test]
fn a_flink_config_yaml_is_read_with_a_reason_for_each_key_weir_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(
        &file,
        "rest.address: 127.0.0.1\nrest.port: 1\ntaskmanager.memory.process.size: 1728m\n\
         env.java.opts.all: -XX:+UseG1GC\nexecution.checkpointing.unaligned.enabled: true\n\
         execution.checkpointing.unaligned.max-subtasks-per-channel-state-file: 5\n\
         metrics.reporter.prom.factory.class: org.apache.flink.metrics.prometheus.PrometheusReporterFactory\n",
    )
    .unwrap();
    let config = file.to_str().unwrap();
    let args = ["counter", "--users", "3", "--events", "10", "--output", "none"];
    let remote = run_weir(&[&["run", "-c", config][..], &args].concat());
    let stderr = String::from_utf8_lossy(&remote.stderr);
    for needle in [
        "'env.java.opts.all' (from",
        "is not applicable in weir: no JVM",
        "'execution.checkpointing.unaligned.max-subtasks-per-channel-state-file' (from",
        "is not supported by weir yet: of the unaligned options only execution.checkpointing.unaligned.enabled",
        "'metrics.reporter.prom.factory.class' (from",
        "is always so in weir: Prometheus text",
        "Submitting to the cluster at 127.0.0.1:1: rest.address is set (from",
        "`weir run -t local ...` runs the job here",
    ] {
        assert!(stderr.contains(needle), "no '{needle}' in:\n{stderr}");
    }
    assert!(!stderr.contains("unknown configuration key"), "{stderr}");
    assert!(!stderr.contains("'taskmanager.memory.process.size'"), "a key weir takes is not warned about: {stderr}");
    assert!(
        !stderr.contains("'execution.checkpointing.unaligned.enabled'"),
        "a key weir takes is not warned about: {stderr}"
    );
    let local = run_weir(&[&["run", "-t", "local", "-D", "rest.port=0", "-c", config][..], &args].concat());
    let stdout = String::from_utf8_lossy(&local.stdout);
    assert!(local.status.success() && stdout.contains("ended with state FINISHED"), "{stdout}");
    assert_usage_error(
        &["run", "-t", "yarn-per-job", "counter", "--users", "1"],
        "'yarn-per-job' is not a target weir has",
    );
}
