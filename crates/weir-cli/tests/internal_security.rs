//! The cluster's ports trust only what proves itself: a TaskManager with another shared
//! secret (or none) is refused with a clear error and one with the right secret runs jobs;
//! a process that registers beside the real TaskManagers cannot fail a job with forged
//! reports; a line without an end does not grow the JobManager's memory.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{RunningWeir, get, patch, poll_json, run_weir};
use weir_api::error::TaskError;
use weir_runtime::cluster::protocol::{ToJobManager, send};
use weir_runtime::execution::{TaskEvent, TaskEventKind};
use weir_runtime::security::{Plane, WireSecurity};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// A JobManager with `settings` (`-D` values); its REST (`HOST:PORT`) and RPC addresses.
fn start_jobmanager(settings: &[&str]) -> (RunningWeir, String, String) {
    let (jobmanager, rest, rpc) = common::start_jobmanager(settings);
    (jobmanager, rest.trim_start_matches("http://").to_string(), rpc)
}

fn taskmanager(rpc: &str, settings: &[&str]) -> RunningWeir {
    let mut args = vec!["taskmanager", "--jobmanager", rpc, "-D", "taskmanager.numberOfTaskSlots=1"];
    for setting in settings {
        args.extend(["-D", setting]);
    }
    RunningWeir::start(&args)
}

#[test]
fn a_taskmanager_with_another_secret_is_refused_and_the_right_one_runs_a_job_across_taskmanagers() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let secret_file_setting = format!("security.internal.secret-file={}", secret_file.display());
    let (_jobmanager, rest, rpc) = start_jobmanager(&[&secret_file_setting]);

    let mut wrong = taskmanager(&rpc, &["security.internal.secret=another secret, 32 bytes long!!"]);
    assert_eq!(wrong.wait(), Some(1), "a TaskManager with another secret kept running");
    let errors: Vec<String> = wrong.stderr_lines().into_iter().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains(
            "the JobManager refused this TaskManager: the shared secret (security.internal.secret) does not match"
        ),
        "{errors:?}"
    );
    let mut missing = taskmanager(&rpc, &[]);
    assert_eq!(missing.wait(), Some(1));
    assert!(
        missing.stderr_lines().iter().any(|l| l.starts_with("error:") && l.contains("requires the shared secret")),
        "{:?}",
        missing.stderr_lines()
    );
    assert_eq!(get(&format!("http://{rest}/overview")).json()["taskmanagers"], 0);

    // The right secret (given inline on one, from the file on the other): both register, and a
    // job at p=2 sends its keyed records from one TaskManager's data port to the other's.
    let inline = format!("security.internal.secret={SECRET}");
    let mut taskmanagers = [taskmanager(&rpc, &[&inline]), taskmanager(&rpc, &[&secret_file_setting])];
    for taskmanager in &mut taskmanagers {
        taskmanager.stderr_line("registered at");
    }
    let submit = run_weir(&[
        "run", "-m", &rest, "-p", "2", "counter", "--users", "100", "--events", "100000", "--output", "none",
    ]);
    assert!(submit.status.success(), "{}", String::from_utf8_lossy(&submit.stderr));
    assert!(
        String::from_utf8_lossy(&submit.stdout).contains("FINISHED"),
        "{}",
        String::from_utf8_lossy(&submit.stdout)
    );

    // A process without the secret cannot open a channel on a TaskManager's data port.
    let data_line = taskmanagers[0].stderr_line("data port");
    let data_port = data_line.rsplit(' ').next().unwrap().to_string();
    let mut stranger = TcpStream::connect(&data_port).unwrap();
    let error = WireSecurity::open().connect(stranger.try_clone().unwrap(), Plane::Data).unwrap_err();
    assert!(error.to_string().contains("requires the shared secret"), "{error}");
    stranger.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(matches!(std::io::Read::read(&mut stranger, &mut [0u8; 1]), Ok(0) | Err(_)));
}

/// A PEM keystore and truststore of one self-signed certificate in `dir`.
fn certificate(dir: &std::path::Path, name: &str) -> [String; 2] {
    let certified = rcgen::generate_simple_self_signed(vec![format!("{name}.weir")]).unwrap();
    let keystore = dir.join(format!("{name}-keystore.pem"));
    let truststore = dir.join(format!("{name}-truststore.pem"));
    std::fs::write(&keystore, format!("{}{}", certified.cert.pem(), certified.signing_key.serialize_pem())).unwrap();
    std::fs::write(&truststore, certified.cert.pem()).unwrap();
    [
        format!("security.ssl.internal.keystore={}", keystore.display()),
        format!("security.ssl.internal.truststore={}", truststore.display()),
    ]
}

#[test]
fn with_mutual_tls_a_job_runs_across_taskmanagers_and_a_stranger_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let [keystore, truststore] = certificate(dir.path(), "cluster");
    let tls = ["security.ssl.internal.enabled=true", keystore.as_str(), truststore.as_str()];
    let (_jobmanager, rest, rpc) = start_jobmanager(&tls);

    let [stranger_keystore, stranger_truststore] = certificate(dir.path(), "stranger");
    let mut stranger =
        taskmanager(&rpc, &["security.ssl.internal.enabled=true", &stranger_keystore, &stranger_truststore]);
    assert_eq!(stranger.wait(), Some(1), "a TaskManager with a stranger certificate kept running");
    assert!(
        stranger
            .stderr_lines()
            .iter()
            .any(|l| l.starts_with("error:") && l.contains("TLS handshake with the JobManager failed")),
        "{:?}",
        stranger.stderr_lines()
    );
    let mut plain = taskmanager(&rpc, &[]);
    assert_eq!(plain.wait(), Some(1), "a TaskManager without TLS kept running");
    assert!(
        plain.stderr_lines().iter().any(|l| l.starts_with("error:") && l.contains("requires TLS")),
        "{:?}",
        plain.stderr_lines()
    );

    let mut taskmanagers = [taskmanager(&rpc, &tls), taskmanager(&rpc, &tls)];
    for taskmanager in &mut taskmanagers {
        taskmanager.stderr_line("registered at");
    }
    let submit = run_weir(&[
        "run", "-m", &rest, "-p", "2", "counter", "--users", "100", "--events", "100000", "--output", "none",
    ]);
    assert!(submit.status.success(), "{}", String::from_utf8_lossy(&submit.stderr));
    assert!(
        String::from_utf8_lossy(&submit.stdout).contains("FINISHED"),
        "{}",
        String::from_utf8_lossy(&submit.stdout)
    );
}

/// Registers as a TaskManager of its own (no secret is configured, so any local process
/// may) and returns the connection once welcomed; `None` when refused.
fn register(rpc: &str, taskmanager_id: &str) -> Option<TcpStream> {
    let stream = TcpStream::connect(rpc).unwrap();
    let mut stream = WireSecurity::open().connect(stream, Plane::Control).unwrap();
    let register = ToJobManager::Register {
        taskmanager_id: taskmanager_id.to_string(),
        slots: 0,
        data_address: "127.0.0.1:9".to_string(),
        running: Vec::new(),
        hardware: Default::default(),
    };
    send(&mut stream, &register).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut welcome = String::new();
    let read = BufReader::new(stream.try_clone().unwrap()).read_line(&mut welcome).unwrap_or(0);
    (read > 0 && welcome.contains("Welcome")).then_some(stream)
}

#[test]
fn forged_reports_from_a_process_that_does_not_run_the_subtasks_do_not_fail_the_job() {
    let (_jobmanager, rest, rpc) = start_jobmanager(&[]);
    let mut taskmanagers = [taskmanager(&rpc, &[]), taskmanager(&rpc, &[])];
    for taskmanager in &mut taskmanagers {
        taskmanager.stderr_line("registered at");
    }
    let submit = run_weir(&[
        "run", "-m", &rest, "-d", "-p", "2", "counter", "--users", "100", "--rate", "20000", "--output", "none",
    ]);
    assert!(submit.status.success(), "{}", String::from_utf8_lossy(&submit.stderr));
    let stdout = String::from_utf8_lossy(&submit.stdout).to_string();
    let job_id = stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim();
    let job_url = format!("http://{rest}/jobs/{job_id}");
    poll_json(&job_url, |job| {
        job["state"] == "RUNNING"
            && job["vertices"].as_array().is_some_and(|vertices| vertices.iter().all(|v| v["status"] == "RUNNING"))
    });

    // Posing as a registered TaskManager is refused.
    let listed = get(&format!("http://{rest}/taskmanagers")).json();
    let real_id = listed["taskmanagers"][0]["id"].as_str().unwrap().to_string();
    assert!(register(&rpc, &real_id).is_none(), "a second registration under a connected TaskManager's id");

    // A process of its own reports every subtask of the first attempts failed.
    let mut forger = register(&rpc, "forger").expect("an open cluster welcomes any TaskManager");
    for attempt in 0..4 {
        for vertex in 0..3 {
            for subtask in 0..2 {
                let kind = TaskEventKind::Failed(TaskError::external("forged", "a failure nobody had"));
                let event = ToJobManager::TaskEvent {
                    job_id: job_id.to_string(),
                    attempt,
                    event: TaskEvent { vertex, subtask, kind },
                };
                send(&mut forger, &event).unwrap();
            }
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let job = get(&job_url).json();
    assert_eq!(job["state"], "RUNNING", "{}", job["failure-cause"]);
    let exceptions = get(&format!("{job_url}/exceptions")).json();
    assert_eq!(exceptions["exceptionHistory"]["entries"], serde_json::json!([]), "{exceptions}");
    assert_eq!(patch(&format!("{job_url}?mode=cancel")).status, 202);
    poll_json(&job_url, |job| job["state"] == "CANCELED");
}

/// The JobManager's resident memory, bytes (`VmRSS` of /proc/PID/status).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Sends up to `bytes` bytes without a newline on `stream`; true when the peer closed the
/// connection before they were all sent.
fn send_endless_line(stream: &mut TcpStream, bytes: usize) -> bool {
    let chunk = vec![b'x'; 1 << 20];
    let mut sent = 0;
    while sent < bytes {
        if stream.write_all(&chunk).is_err() {
            return true;
        }
        sent += chunk.len();
    }
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    matches!(std::io::Read::read(stream, &mut [0u8; 1]), Ok(0) | Err(_))
}

const ENDLESS_LINE_BYTES: usize = 300 << 20;
const GROWTH_MAX: u64 = 64 << 20;

#[test]
fn a_line_without_an_end_is_cut_off_and_does_not_grow_the_jobmanagers_memory() {
    let (jobmanager, _rest, rpc) = start_jobmanager(&[]);
    // Let it settle (threads started, REST served once).
    std::thread::sleep(Duration::from_millis(500));
    let before = resident_bytes(jobmanager.pid());

    // Before registering: the registration's limit.
    let started = Instant::now();
    let stream = TcpStream::connect(&rpc).unwrap();
    let mut stream = WireSecurity::open().connect(stream, Plane::Control).unwrap();
    assert!(send_endless_line(&mut stream, ENDLESS_LINE_BYTES), "the JobManager kept reading an endless registration");
    std::thread::sleep(Duration::from_millis(300));
    let after_registration = resident_bytes(jobmanager.pid());
    assert!(
        after_registration < before + GROWTH_MAX,
        "an endless registration grew the JobManager from {before} to {after_registration} bytes"
    );

    // After registering: the control line's limit.
    let mut registered = register(&rpc, "endless").expect("registered");
    assert!(send_endless_line(&mut registered, ENDLESS_LINE_BYTES), "the JobManager kept reading an endless message");
    std::thread::sleep(Duration::from_millis(300));
    let after_message = resident_bytes(jobmanager.pid());
    assert!(
        after_message < before + GROWTH_MAX,
        "an endless message grew the JobManager from {before} to {after_message} bytes"
    );
    eprintln!(
        "JobManager resident memory: {} MiB before, {} MiB after an endless registration, {} MiB after an endless message",
        before >> 20,
        after_registration >> 20,
        after_message >> 20
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}
