//! Runs docs/tutorial.md so it cannot rot: every ```bash block in order in one bash shell
//! (`set -eu`), with the built `weir` first on `PATH`, `/tmp/weir-tutorial` replaced by a
//! temporary directory and the ports 8081 and 6123 by free ones. A ```text block right after a
//! ```bash block is that block's output: each of its lines must match a line of the real output,
//! in order (`<...>` matches anything; a `...` line marks lines left out). Then the key outcomes
//! of each step are asserted. Whatever happens, every process the script started ends: the
//! script runs in its own process group, and a guard stops the cluster and kills the group.

mod common;
use common::BoundedOutput;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::kill_processes_naming;

const TUTORIAL: &str = include_str!("../../../docs/tutorial.md");

/// Longest the whole tutorial may take.
const TUTORIAL_TIMEOUT: Duration = Duration::from_secs(120);

/// Printed before each block's commands, so the output can be split by block.
const MARKER: &str = "@@@tutorial-step ";
/// Printed once the last block succeeded.
const DONE: &str = "@@@tutorial-done";

/// What the tutorial names and the test replaces.
const TUTORIAL_DIR: &str = "/tmp/weir-tutorial";
/// The ports the tutorial names, each replaced by a free one: the JobManager's REST and RPC
/// ports, the second JobManager's (`cluster start --jobmanagers 2` gives it the next ones),
/// etcd's client and peer ports, and the deployment controller's.
const TUTORIAL_PORTS: [&str; 7] = ["8081", "8082", "6123", "6124", "2379", "2380", "8085"];

/// One ```bash block and the ```text block showing its output, if any.
struct Step {
    /// Line of the opening fence in docs/tutorial.md (1-based).
    line: usize,
    script: String,
    expected: Option<Vec<String>>,
}

/// The fenced blocks of `markdown`: (line of the opening fence, info string, body).
fn fenced_blocks(markdown: &str) -> Vec<(usize, String, String)> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else { continue };
        let mut body = String::new();
        for (_, inner) in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            body.push_str(inner);
            body.push('\n');
        }
        blocks.push((index + 1, info.trim().to_string(), body));
    }
    blocks
}

/// The ```bash blocks with their outputs, in order. A ```text block is a block's output only
/// when nothing but blank lines separates the two.
fn steps(markdown: &str) -> Vec<Step> {
    let lines: Vec<&str> = markdown.lines().collect();
    let blocks = fenced_blocks(markdown);
    let mut steps = Vec::new();
    for (i, (line, info, body)) in blocks.iter().enumerate() {
        if info != "bash" {
            continue;
        }
        let expected = blocks.get(i + 1).and_then(|(next_line, next_info, next_body)| {
            let closing = line + body.lines().count(); // 0-based index of the closing fence
            let between = &lines[closing + 1..next_line - 1];
            (next_info == "text" && between.iter().all(|l| l.trim().is_empty()))
                .then(|| next_body.lines().map(str::to_string).collect())
        });
        steps.push(Step { line: *line, script: body.clone(), expected });
    }
    steps
}

/// Whether `actual` matches `pattern`, where each `<...>` in the pattern matches any text.
fn matches(pattern: &str, actual: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('<') {
        match rest[open..].find('>') {
            Some(close) => {
                literals.push(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    literals.push(rest);
    let (first, last) = (literals[0], literals[literals.len() - 1]);
    if literals.len() == 1 {
        return actual == first;
    }
    if !actual.starts_with(first) || !actual[first.len()..].ends_with(last) {
        return false;
    }
    let mut middle = &actual[first.len()..actual.len() - last.len()];
    for literal in &literals[1..literals.len() - 1] {
        match middle.find(literal) {
            Some(at) => middle = &middle[at + literal.len()..],
            None => return false,
        }
    }
    true
}

/// The first line of `expected` (in order) that no line of `actual` matches.
fn unmatched_line(expected: &[String], actual: &str) -> Option<String> {
    let mut actual = actual.lines().map(str::trim);
    for wanted in expected.iter().map(|l| l.trim()) {
        if wanted.is_empty() || wanted == "..." {
            continue;
        }
        if !actual.any(|line| matches(wanted, line)) {
            return Some(wanted.to_string());
        }
    }
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Free ports for [`TUTORIAL_PORTS`], all different: pairs of consecutive free ports for each
/// JobManager's port and its standby's, then two for etcd.
fn free_ports() -> Vec<String> {
    let mut taken: Vec<u16> = Vec::new();
    let pair = |taken: &mut Vec<u16>| loop {
        let port = free_port();
        let next = port.checked_add(1);
        if let Some(next) = next
            && !taken.contains(&port)
            && !taken.contains(&next)
            && TcpListener::bind(("127.0.0.1", next)).is_ok()
        {
            taken.extend([port, next]);
            return;
        }
    };
    pair(&mut taken);
    pair(&mut taken);
    while taken.len() < TUTORIAL_PORTS.len() {
        let port = free_port();
        if !taken.contains(&port) {
            taken.push(port);
        }
    }
    taken.iter().map(u16::to_string).collect()
}

/// The tutorial's text with its directory and ports replaced.
struct Localize {
    dir: String,
    /// In the order of [`TUTORIAL_PORTS`].
    ports: Vec<String>,
}

impl Localize {
    /// One substitution pass: a value put in never gets replaced again (a temporary
    /// directory's name or a free port may well contain "6123").
    fn apply(&self, text: &str) -> String {
        let mut text = text.replace(TUTORIAL_DIR, "\u{0}dir\u{0}");
        for (index, port) in TUTORIAL_PORTS.iter().enumerate() {
            text = text.replace(port, &format!("\u{0}{index}\u{0}"));
        }
        text = text.replace("\u{0}dir\u{0}", &self.dir);
        for (index, port) in self.ports.iter().enumerate() {
            text = text.replace(&format!("\u{0}{index}\u{0}"), port);
        }
        text
    }
}

/// The running script. On drop, whatever it left running ends: `weir cluster stop` for the
/// cluster's pid file, then SIGKILL to the script's process group (every process the
/// tutorial starts, background ones included, is in it), then the directory goes.
struct Guard {
    child: Child,
    weir: PathBuf,
    data_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.data_dir.join("cluster/cluster.pids").exists() {
            let _ = Command::new(&self.weir)
                .args(["cluster", "stop"])
                .env("WEIR_DATA_DIR", &self.data_dir)
                .env_remove("WEIR_CONF_DIR")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        // The operator and the deployments' clusters run in process groups of their own:
        // end every process whose command line names the tutorial's directory.
        let _ = Command::new(&self.weir)
            .args(["operator", "stop"])
            .env("WEIR_DATA_DIR", &self.data_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        kill_processes_naming(&self.data_dir);
        // The group's id is the script's pid (process_group(0)).
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The output of each step, split at the markers; the second value says whether the script
/// got through every step.
fn split_outputs(transcript: &[String], count: usize) -> (Vec<String>, bool) {
    let mut outputs = vec![String::new(); count];
    let mut current: Option<usize> = None;
    let mut done = false;
    for line in transcript {
        if let Some(index) = line.strip_prefix(MARKER) {
            current = index.trim().parse().ok();
        } else if line == DONE {
            done = true;
            current = None;
        } else if let Some(index) = current {
            outputs[index].push_str(line);
            outputs[index].push('\n');
        }
    }
    (outputs, done)
}

#[test]
fn the_tutorial_runs_as_written() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let localize = Localize { dir: dir.path().join("weir-tutorial").display().to_string(), ports: free_ports() };
    for (tool, install) in [("bash", "bash"), ("curl", "curl"), ("awk", "gawk"), ("etcd", "etcd-server")] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).bounded_output().unwrap();
        assert!(
            found.status.success(),
            "the tutorial needs `{tool}` on PATH: apt-get install -y {install} (.ci/test installs etcd-server)"
        );
    }
    let steps = steps(TUTORIAL);
    assert!(steps.len() >= 10, "docs/tutorial.md has only {} ```bash blocks", steps.len());

    let mut script = String::from("exec 2>&1\nset -eu\n");
    for (index, step) in steps.iter().enumerate() {
        script.push_str(&format!("echo '{MARKER}{index}'\n"));
        script.push_str(&localize.apply(&step.script));
    }
    script.push_str(&format!("echo '{DONE}'\n"));
    let script_path = dir.path().join("tutorial.sh");
    std::fs::write(&script_path, &script).unwrap();

    let weir = PathBuf::from(env!("CARGO_BIN_EXE_weir"));
    let bin_dir = weir.parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .arg(&script_path)
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("WEIR_JOBMANAGER")
        .env_remove("WEIR_CONF_DIR")
        .env_remove("WEIR_DATA_DIR")
        .env_remove("WEIR_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let stdout = child.stdout.take().unwrap();
    let data_dir = PathBuf::from(&localize.dir);
    let mut guard = Guard { child, weir, data_dir: data_dir.clone(), _dir: dir };

    let transcript = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let transcript = Arc::clone(&transcript);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                transcript.lock().unwrap().push(line);
            }
        })
    };
    let deadline = started + TUTORIAL_TIMEOUT;
    let status = loop {
        if let Some(status) = guard.child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The pipe closes when bash exits (nothing else holds it); allow a moment regardless.
    let drained = Instant::now() + Duration::from_secs(2);
    while !reader.is_finished() && Instant::now() < drained {
        std::thread::sleep(Duration::from_millis(10));
    }
    let transcript = transcript.lock().unwrap().clone();
    let (outputs, done) = split_outputs(&transcript, steps.len());
    // Shown on failure, or with --nocapture.
    println!("{}", transcript.join("\n"));

    let report = |index: usize| {
        format!(
            "the ```bash block at docs/tutorial.md:{}:\n{}\nprinted:\n{}",
            steps[index].line, steps[index].script, outputs[index]
        )
    };
    let last_started = transcript.iter().rev().find_map(|l| l.strip_prefix(MARKER)?.trim().parse::<usize>().ok());
    match (status, done) {
        (None, _) => panic!(
            "the tutorial did not finish within {TUTORIAL_TIMEOUT:?}; it was at {}",
            last_started.map(report).unwrap_or_else(|| "its start".into())
        ),
        (Some(status), false) => panic!(
            "the tutorial stopped ({status}) in {}",
            last_started.map(report).unwrap_or_else(|| transcript.join("\n"))
        ),
        (Some(status), true) => assert!(status.success(), "bash ended with {status}"),
    }

    // Every shown output is what the commands print.
    for (index, step) in steps.iter().enumerate() {
        if let Some(expected) = &step.expected {
            let expected: Vec<String> = expected.iter().map(|l| localize.apply(l)).collect();
            if let Some(line) = unmatched_line(&expected, &outputs[index]) {
                panic!(
                    "the output shown after the block does not match; no line matches\n  {line}\nin {}",
                    report(index)
                );
            }
        }
    }

    // The key outcomes, step by step. `output("...")` is the output of the first block whose
    // commands contain the text.
    let output = |needle: &str| -> &str {
        let index = steps
            .iter()
            .position(|s| s.script.contains(needle))
            .unwrap_or_else(|| panic!("no ```bash block of docs/tutorial.md contains {needle:?}"));
        &outputs[index]
    };
    let start = output("weir cluster start");
    assert!(start.contains("2 TaskManager(s) with 4 slot(s) each"), "{start}");
    let submitted = output("JOB=$(weir run -d -p 4 counter");
    let job = submitted.lines().find_map(|l| l.strip_prefix("JOB=")).unwrap_or_default().trim().to_string();
    assert!(job.len() == 32 && job.bytes().all(|b| b.is_ascii_hexdigit()), "no job id: {submitted}");
    assert!(output("wait_running() {").contains(&format!("{job} : counter (RUNNING)")));

    // 2. Checkpoints: on, every second, completed ones with a size and a path.
    let checkpoints = output("/checkpoints/config");
    assert!(checkpoints.contains("\"checkpointing_enabled\":true"), "{checkpoints}");
    assert!(checkpoints.contains("\"interval\":1000"), "{checkpoints}");
    assert!(checkpoints.contains("\"status\":\"COMPLETED\""), "{checkpoints}");
    assert!(checkpoints.contains(&format!("/checkpoints/{job}/chk-")), "{checkpoints}");

    // 3. A TaskManager killed: RESTARTING, then RUNNING again, one restart, one exception.
    assert!(output("kill -9").contains(&format!("{job} : counter (RESTARTING)")), "{}", output("kill -9"));
    let recovered = output("\"numRestarts\"");
    assert!(recovered.contains(&format!("{job} : counter (RUNNING)")), "{recovered}");
    assert!(recovered.contains("\"numRestarts\":1"), "{recovered}");
    assert!(output("/exceptions").contains("the connection was lost"), "{}", output("/exceptions"));
    assert!(output("check\n").contains("10 users, 0 with a lost or duplicated count"), "{}", output("check\n"));
    let added = output("weir cluster add-taskmanager");
    assert!(added.contains("TaskManager started in") && added.contains("\"slots-total\":8"), "{added}");

    // 4. Stop with a savepoint: a savepoint directory with its _metadata.
    let stopped = output("weir stop --savepoint-path /tmp/weir-tutorial/savepoints $JOB\n");
    assert!(stopped.contains("Savepoint completed. Path: file://"), "{stopped}");
    let inspected = output("weir savepoint inspect");
    assert!(inspected.lines().any(|l| l == "_metadata"), "{inspected}");
    assert!(inspected.contains("max parallelism:  128"), "{inspected}");

    // 5. Restored at parallelism 8 from that savepoint.
    let rescaled = output("-p 8 counter");
    assert!(rescaled.contains("\"parallelism\":8"), "{rescaled}");
    assert!(rescaled.contains("\"restored\":{") && rescaled.contains("/savepoints/savepoint-"), "{rescaled}");

    // 6. -p 256 refused: max parallelism 128.
    let refused = output("-p 256");
    assert!(
        refused.contains("error: cannot restore from")
            && refused.contains("above the snapshot's max parallelism 128")
            && refused.contains("refused with exit code 2"),
        "{refused}"
    );

    // 7. An operator removed: refused without -n, naming enrich; running with -n.
    let without_n = output("weir stop --savepoint-path /tmp/weir-tutorial/savepoints $JOB2");
    assert!(
        without_n.contains("not in the job: 'enrich'")
            && without_n.contains("-n/--allow-non-restored-state")
            && without_n.contains("refused with exit code 2"),
        "{without_n}"
    );
    let with_n = output(" -n -p 4 counter");
    assert!(with_n.contains(": counter (RUNNING)"), "{with_n}");
    assert!(with_n.contains("the state of operator 'enrich' is not restored"), "{with_n}");
    let last_check = &outputs[steps.iter().rposition(|s| s.script.contains("check\n")).unwrap()];
    assert!(last_check.contains("10 users, 0 with a lost or duplicated count"), "{last_check}");

    // 8. On an HA cluster, the leader killed: the job RUNNING under the other JobManager,
    // RECONCILING on its way, never restarted, exactly-once.
    let moved = output("weir cluster start --jobmanagers 2");
    assert!(moved.contains("Stopped 3 cluster process(es).") && moved.contains("High availability on etcd"), "{moved}");
    let before = output("OLD=$(leader)");
    assert!(
        before.contains("\"high-availability\":{\"type\":\"etcd\"") && before.contains("\"leader-pid\":"),
        "{before}"
    );
    let taken_over = output("kill -9 $(curl");
    assert!(taken_over.contains(": counter (RUNNING)"), "{taken_over}");
    assert!(taken_over.contains("\"numRestarts\":0"), "{taken_over}");
    assert!(taken_over.contains("\"RECONCILING\":"), "{taken_over}");
    let ha_check = output("$NEW/jobs/$JOB4/checkpoints");
    assert!(ha_check.contains("10 users, 0 with a lost or duplicated count"), "{ha_check}");

    // 9. Deployments: 4 -> 8 in each mode; counts go on in savepoint and last-state mode and
    // start again in stateless mode.
    let upgraded = output("deploy $mode 8; done");
    assert!(upgraded.contains("orders-savepoint   STABLE     RUNNING    savepoint     2/2"), "{upgraded}");
    assert!(upgraded.contains("UPGRADE   CANONICAL  file://"), "{upgraded}");
    let counted = output("counts /tmp/weir-tutorial/orders-savepoint");
    assert_eq!(counted.matches("10 users, 0 whose counts").count(), 2, "{counted}");
    assert!(counted.contains("10 users, 10 whose counts"), "{counted}");
    assert!(output("weir operator stop").contains("Stopped the operator"), "{}", output("weir operator stop"));
    // The operator, started with -d and no WEIR_LOG, told each step it took in its log.
    let operator_log = std::fs::read_to_string(data_dir.join("operator/operator.log")).unwrap_or_default();
    for step in ["stop job ", "with a savepoint into file://", "stop cluster ", "start cluster ", "submit job "] {
        assert!(operator_log.contains(step), "the operator's log has no '{step}':\n{operator_log}");
    }

    // 10. Stopped.
    let stopped = &outputs[steps.len() - 1];
    assert!(stopped.contains("Stopped 3 cluster process(es)."), "{stopped}");
    assert!(!data_dir.join("cluster/cluster.pids").exists(), "weir cluster stop left its pid file");

    // On disk: three savepoints and the retained checkpoints, each with its _metadata.
    let savepoints = metadata_dirs(&data_dir.join("savepoints"));
    assert_eq!(savepoints.len(), 3, "{savepoints:?}");
    let retained = metadata_dirs(&data_dir.join("checkpoints").join(&job));
    assert!(!retained.is_empty(), "no retained checkpoint of {job}");
    eprintln!("the tutorial ran in {:?}", started.elapsed());
}

/// The subdirectories of `dir` that hold a `_metadata` file.
fn metadata_dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("_metadata").is_file()).collect()
}

#[test]
fn localizing_is_one_pass() {
    let ports = ["16123", "8081", "2380", "6124", "1", "2", "3"].map(String::from).to_vec();
    let localize = Localize { dir: "/tmp/x8081".into(), ports };
    assert_eq!(
        localize.apply("/tmp/weir-tutorial/a rest.port: 8081 rpc 6123 standby 8082 6124 etcd 2379 2380"),
        "/tmp/x8081/a rest.port: 16123 rpc 2380 standby 8081 6124 etcd 1 2"
    );
}

#[test]
fn output_patterns_match_placeholders() {
    assert!(matches("JOB=<32 hex digits>", "JOB=4ae355c4fefe4f1cac8053666f33bd27"));
    assert!(matches("a <x> b <y> c", "a 1 b 2 c"));
    assert!(!matches("a <x> b <y> c", "a 1 c"));
    assert!(matches("<pid>", "28042"));
    assert!(!matches("exact", "exact and more"));
    assert!(unmatched_line(&["one".into(), "...".into(), "<n> three".into()], "one\ntwo\n3 three\n").is_none());
    assert_eq!(unmatched_line(&["two".into(), "one".into()], "one\ntwo\n"), Some("one".into()));
}

#[test]
fn the_tutorial_has_runnable_steps_with_outputs() {
    let steps = steps(TUTORIAL);
    assert!(steps.iter().any(|s| s.script.contains("weir cluster start")));
    assert!(
        steps.last().unwrap().script.contains("weir cluster stop"),
        "the tutorial must end by stopping the cluster"
    );
    assert!(steps.iter().filter(|s| s.expected.is_some()).count() >= 10);
}
