//! Checkpoints and savepoints in an S3-compatible store (moto's server), through the same
//! configuration keys as local directories: `s3://bucket/prefix` plus the usual AWS_*
//! environment (`AWS_ENDPOINT_URL` for a non-AWS endpoint).
//!
//! The server comes from `$WEIR_MOTO_SERVER` (`.ci/test` installs moto and sets it); without it
//! the test fails naming the install command: no test passes having tested nothing.

mod common;
use common::BoundedOutput;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{RunningWeir, poll_json, run_weir};

struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_moto(server: &str) -> Moto {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {server} (WEIR_MOTO_SERVER): {e}; .ci/test installs moto and sets it")
        });
    let endpoint = format!("http://127.0.0.1:{port}");
    let moto = Moto { child, endpoint };
    let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if agent.put(format!("{}/weir-test", moto.endpoint)).send_empty().is_ok() {
            return moto;
        }
        assert!(Instant::now() < deadline, "moto did not start on {}", moto.endpoint);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn with_s3_env(mut command: std::process::Command, endpoint: &str) -> std::process::Command {
    command
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1");
    command
}

#[test]
fn checkpoints_and_savepoints_go_to_s3_and_a_job_restores_from_there() {
    let Ok(server) = std::env::var("WEIR_MOTO_SERVER") else {
        panic!(
            "this test needs moto's S3 server and WEIR_MOTO_SERVER naming it, which is not set: run it \
             through .ci/test (it installs moto into .ci/venv and sets WEIR_MOTO_SERVER), or \
             `python3 -m venv .ci/venv && .ci/venv/bin/pip install 'moto[server]'` and \
             WEIR_MOTO_SERVER=$PWD/.ci/venv/bin/moto_server"
        );
    };
    let moto = start_moto(&server);
    // The weir processes get the S3 settings through their environment, per command.
    let mut weir = RunningWeir::start_with(
        |command| with_s3_env(command, &moto.endpoint),
        &[
            "run",
            "-D",
            "rest.port=0",
            "-D",
            "execution.checkpointing.interval=100ms",
            "-D",
            "state.checkpoints.dir=s3://weir-test/checkpoints",
            "-D",
            "state.savepoints.dir=s3://weir-test/savepoints",
            "-p",
            "2",
            "counter",
            "--users",
            "10",
            "--rate",
            "2000",
            "--output",
            "none",
        ],
    );
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    let checkpoints =
        poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(2));
    let path = checkpoints["latest"]["completed"]["external_path"].as_str().unwrap().to_string();
    assert!(path.starts_with(&format!("s3://weir-test/checkpoints/{job_id}/chk-")), "{path}");

    let stop = with_s3_env(common::weir(), &moto.endpoint)
        .args(["stop", "-m", rest.trim_start_matches("http://"), &job_id])
        .bounded_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&stop.stdout).to_string();
    assert!(stop.status.success(), "{stdout}{}", String::from_utf8_lossy(&stop.stderr));
    let savepoint =
        stdout.lines().find_map(|l| l.strip_prefix("Savepoint completed. Path: ")).unwrap().trim().to_string();
    assert!(savepoint.starts_with("s3://weir-test/savepoints/savepoint-"), "{savepoint}");
    assert_eq!(weir.wait(), Some(0));

    let inspect = with_s3_env(common::weir(), &moto.endpoint)
        .args(["savepoint", "inspect", &savepoint])
        .bounded_output()
        .unwrap();
    assert!(inspect.status.success(), "{}", String::from_utf8_lossy(&inspect.stderr));
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("Operator 'counter'"));

    let restored = with_s3_env(common::weir(), &moto.endpoint)
        .args([
            "run",
            "-D",
            "rest.port=0",
            "-s",
            &savepoint,
            "-p",
            "3",
            "counter",
            "--users",
            "10",
            "--events",
            "1",
            "--output",
            "none",
        ])
        .bounded_output()
        .unwrap();
    assert!(restored.status.success(), "{}", String::from_utf8_lossy(&restored.stderr));
    let _ = run_weir(&["jobs"]);
}
