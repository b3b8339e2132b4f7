//! weir's OpenAPI document is exact: schemathesis (PyPI), which generates requests from
//! `/openapi.json` and checks every answer against it, finds no failure on a running job of
//! the embedded cluster: no schema-valid request refused, no schema-violating one accepted,
//! no undocumented status, body or header, no server error.
//!
//! schemathesis comes from `.ci/test` (WEIR_SCHEMATHESIS).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::start_running;

fn schemathesis() -> PathBuf {
    let path = std::env::var_os("WEIR_SCHEMATHESIS").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "WEIR_SCHEMATHESIS is not set: run the tests with `.ci/test`, which installs schemathesis \
             (`python3 -m venv .ci/venv-schemathesis && .ci/venv-schemathesis/bin/pip install schemathesis==4.32.5`) \
             and sets it"
        )
    });
    assert!(path.is_file(), "{} does not exist: `.ci/test` installs it", path.display());
    path
}

#[test]
fn schemathesis_finds_no_failure_in_the_openapi_document() {
    let schemathesis = schemathesis();
    // Its own directory: relative savepoint paths the fuzzer sends resolve inside it.
    let dir = tempfile::tempdir().unwrap();
    let (_weir, rest, _job) = start_running(&[
        "run",
        "-D",
        "rest.port=0",
        "-D",
        &format!("state.savepoints.dir=file://{}", dir.path().join("savepoints").display()),
        "counter",
        "--users",
        "100",
        "--rate",
        "500",
        "--output",
        "none",
    ]);
    let mut command = Command::new(&schemathesis);
    command
        .args(["run", &format!("{rest}/openapi.json"), "--max-examples", "20", "--seed", "20261201"])
        .arg("--generation-deterministic")
        .current_dir(dir.path())
        .env("NO_COLOR", "1");
    let (output, ended) = common::output_within(command, Duration::from_secs(300));
    assert!(ended, "schemathesis did not end in 300 s");
    let report = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "schemathesis found failures:\n{report}");
    // It really tested: every operation, many cases, none failing.
    assert!(report.contains("Tested: "), "{report}");
    let generated: u64 = report
        .lines()
        .find_map(|l| l.trim().split_once(" generated").and_then(|(n, _)| n.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no case count in:\n{report}"));
    assert!(generated >= 500, "only {generated} cases:\n{report}");
    assert!(!report.contains("failures"), "{report}");
}
