//! Native and canonical savepoints (Flink's `formatType`): `weir savepoint --type native`
//! and `weir stop --type canonical`, what `inspect` says of each, a native savepoint refused by
//! `rewrite` and by another state backend (with what to do), and a stop and restore through
//! both formats with a rescale, exactly once. Checkpoints are native.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{assert_counts_exactly_once, committed_lines, run_weir, start_running as start};
use weir_checkpoint::{decode_metadata, encode_metadata};

fn path_in(stdout: &str) -> PathBuf {
    let line =
        stdout.lines().find(|l| l.starts_with("Savepoint completed. Path: ")).unwrap_or_else(|| panic!("{stdout}"));
    PathBuf::from(line.trim_start_matches("Savepoint completed. Path: ").trim().trim_start_matches("file://"))
}

fn weir_ok(args: &[&str]) -> String {
    let output = run_weir(args);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "weir {args:?}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

fn weir_refused(args: &[&str]) -> String {
    let output = run_weir(args);
    assert_eq!(output.status.code(), Some(2), "weir {args:?} was not refused: {output:?}");
    String::from_utf8_lossy(&output.stderr).to_string()
}

fn assert_exactly_once(dir: &Path, users: u64, events: u64) {
    assert_counts_exactly_once(&committed_lines(dir), users, events);
}

#[test]
fn native_and_canonical_savepoints_restore_and_say_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let sp = dir.path().join("sp");
    let sp_arg = sp.to_str().unwrap().to_string();
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
    let job = ["counter", "--users", "20", "--events", "60000", "--rate", "12000", "--output", &out_arg];
    let common = ["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];

    let mut args: Vec<&str> = common.to_vec();
    args.extend(["-p", "2"]);
    args.extend(job);
    let (mut first, rest, job_id) = start(&args);
    let address = rest.trim_start_matches("http://").to_string();
    // A native savepoint while the job runs, and a canonical one.
    let native = path_in(&weir_ok(&["savepoint", "-m", &address, "--type", "native", &job_id, &sp_arg]));
    let text = weir_ok(&["savepoint", "inspect", native.to_str().unwrap()]);
    assert!(
        text.contains("format:           native (written by the hashmap state backend; only that backend restores it)"),
        "{text}"
    );
    let json = weir_ok(&["savepoint", "inspect", "--json", native.to_str().unwrap()]);
    assert!(json.contains("\"format\": \"NATIVE\"") && json.contains("\"state_backend\": \"hashmap\""), "{json}");
    // rewrite works on canonical savepoints only.
    let refused = weir_refused(&[
        "savepoint",
        "rewrite",
        "--max-parallelism",
        "256",
        native.to_str().unwrap(),
        dir.path().join("rewritten").to_str().unwrap(),
    ]);
    assert!(refused.contains("is a native snapshot") && refused.contains("--type canonical"), "{refused}");
    // Checkpoints are native.
    std::thread::sleep(Duration::from_millis(300));
    let chk = std::fs::read_dir(dir.path().join("chk").join(&job_id))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("_metadata").is_file())
        .unwrap();
    let metadata = decode_metadata(&std::fs::read(chk.join("_metadata")).unwrap(), "chk").unwrap();
    assert_eq!(metadata.format, weir_checkpoint::SnapshotFormat::Native);

    // A native snapshot of another backend is refused before anything starts, saying what to do.
    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    for entry in std::fs::read_dir(&native).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), foreign.join(entry.file_name())).unwrap();
    }
    let mut metadata = decode_metadata(&std::fs::read(foreign.join("_metadata")).unwrap(), "sp").unwrap();
    metadata.state_backend = Some("rocksdb".into());
    std::fs::write(foreign.join("_metadata"), encode_metadata(&metadata)).unwrap();
    let foreign_arg = foreign.to_str().unwrap().to_string();
    let mut args: Vec<&str> = vec!["run", "--dry-run", "-s", &foreign_arg];
    args.extend(job);
    let refused = weir_refused(&args);
    assert!(
        refused.contains("native snapshot of the rocksdb state backend") && refused.contains("--type canonical"),
        "{refused}"
    );

    // Stop with a canonical savepoint, restore it at -p 3, stop native, restore that at -p 1.
    let stopped =
        path_in(&weir_ok(&["stop", "-m", &address, "--type", "canonical", "--savepoint-path", &sp_arg, &job_id]));
    assert_eq!(first.wait(), Some(0));
    let text = weir_ok(&["savepoint", "inspect", stopped.to_str().unwrap()]);
    assert!(text.contains("format:           canonical"), "{text}");
    let stopped_arg = stopped.to_str().unwrap().to_string();
    let mut args: Vec<&str> = common.to_vec();
    args.extend(["-s", &stopped_arg, "-p", "3"]);
    args.extend(job);
    let (mut second, rest, job_id) = start(&args);
    let address = rest.trim_start_matches("http://").to_string();
    std::thread::sleep(Duration::from_millis(500));
    let stopped =
        path_in(&weir_ok(&["stop", "-m", &address, "--type", "native", "--savepoint-path", &sp_arg, &job_id]));
    assert_eq!(second.wait(), Some(0));
    let stopped_arg = stopped.to_str().unwrap().to_string();
    let mut args: Vec<&str> = common.to_vec();
    args.extend(["-s", &stopped_arg, "-p", "1"]);
    args.extend(job);
    weir_ok(&args);
    assert_exactly_once(&out, 20, 60_000);
}

#[test]
fn a_bad_format_type_is_refused_naming_the_values() {
    let output = run_weir(&["savepoint", "--type", "fast", "0123456789abcdef0123456789abcdef"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("canonical") && stderr.contains("native"), "{stderr}");
}
