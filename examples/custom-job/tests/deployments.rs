//! Declarative deployments with real processes: `weir operator` (here `my-weir operator`)
//! moves `versioned-counter` between the four versions of the binary (v2 adds an operator,
//! v3 changes a state's type, v4 fails at once or crashes at start), in each upgrade mode,
//! with parallelism changes, suspends and resumes, a pre-flight refusal, rollbacks (after the
//! readiness timeout, from the upgrade savepoint or the failed job's checkpoint), upgrades of
//! a failed job, and the controller killed at random points of upgrades. Every time: the counts carry on exactly once (no
//! user's count lost or repeated in the committed output), and no two clusters of one
//! deployment ever run at once.

mod common;
use common::bounded::BoundedOutput;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

#[test]
fn upgrades_in_every_mode_suspend_and_resume_carry_the_counts_on_exactly_once() {
    let harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    assert!(harness.apply(&spec).contains("deployment.weir.dev/counts created"));
    let first = harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());

    // savepoint mode, a new binary with one more operator, parallelism 2 -> 4.
    spec.version = 2;
    spec.parallelism = 4;
    harness.apply(&spec);
    let second = harness.wait_stable(2);
    assert_ne!(job_id(&first), job_id(&second));
    let history = second["status"]["savepointHistory"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{second:#}");
    assert_eq!(history[0]["triggerType"], "UPGRADE");
    let savepoint = history[0]["location"].as_str().unwrap().trim_start_matches("file://").to_string();
    assert!(Path::new(&savepoint).join("_metadata").is_file(), "the upgrade savepoint {savepoint} is not on disk");
    assert_eq!(second["status"]["jobStatus"]["upgradeSavepointPath"], history[0]["location"]);
    assert_eq!(second["status"]["clusterInfo"]["binary"], binary(2));
    let counts = wait_counts_beyond(&out, &counts);

    // last-state mode, parallelism 4 -> 3.
    spec.mode = "last-state";
    spec.parallelism = 3;
    harness.apply(&spec);
    let third = harness.wait_stable(3);
    assert!(third["status"]["jobStatus"]["restoredFrom"].as_str().unwrap().contains("/chk-"), "{third:#}");
    wait_counts_beyond(&out, &counts);

    // Suspended in savepoint mode: the job stops with a savepoint, the cluster goes.
    spec.mode = "savepoint";
    spec.state = "suspended";
    harness.apply(&spec);
    let suspended = harness.wait("SUSPENDED", |s| s["status"]["lifecycleState"] == "SUSPENDED");
    assert_eq!(generation(&suspended), 4);
    let dirs = weir_deploy::processes::DeploymentDirs::new(harness.deployment_dir());
    assert!(dirs.clusters().iter().all(|(_, dir)| weir_deploy::processes::processes_of(dir).is_empty()));
    let at_suspend = committed_counts(&out);
    // Resumed from what the suspend left.
    spec.state = "running";
    harness.apply(&spec);
    let resumed = harness.wait_stable(5);
    assert_eq!(
        resumed["status"]["jobStatus"]["restoredFrom"],
        suspended["status"]["jobStatus"]["upgradeSavepointPath"]
    );
    wait_counts_beyond(&out, &at_suspend);

    // stateless: the counts start again (into another directory, as the lesson warns).
    let fresh = harness.out("fresh");
    spec.mode = "stateless";
    spec.output = fresh.clone();
    harness.apply(&spec);
    let stateless = harness.wait_stable(6);
    assert!(stateless["status"]["jobStatus"].get("restoredFrom").is_none(), "{stateless:#}");
    // Counts in the new directory are 1, 2, 3, ... again (committed_counts checks each
    // user's run starts at 1): no state was carried over.
    wait_counts_beyond(&fresh, &BTreeMap::new());
    committed_counts(&out);
    assert_eq!(harness.most_clusters_alive_at_once(), 1, "two clusters of the deployment ran at once");

    // The operator's REST API serves the same, in the Flink operator's status shape.
    let log = std::fs::read_to_string(harness.dir.path().join("operator.log")).unwrap();
    let rest = log.lines().rev().find_map(|l| l.split("REST API and Web UI at ").nth(1)).unwrap().trim().to_string();
    let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let body = agent.get(format!("{rest}/deployments/counts")).call().unwrap().body_mut().read_to_string().unwrap();
    let served: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(served["status"]["lifecycleState"], "STABLE", "{served:#}");
    assert_eq!(served["status"]["jobStatus"]["jobId"], stateless["status"]["jobStatus"]["jobId"]);
    let body = agent.get(format!("{rest}/deployments")).call().unwrap().body_mut().read_to_string().unwrap();
    assert!(body.starts_with("{\"deployments\":[{\"apiVersion\":\"weir.dev/v1\""), "{body}");

    // A manual savepoint through the nonce.
    spec.nonce = Some(1);
    harness.apply(&spec);
    let manual = harness.wait("a MANUAL savepoint", |s| {
        s["status"]["savepointHistory"].as_array().is_some_and(|h| h.iter().any(|r| r["triggerType"] == "MANUAL"))
    });
    assert_eq!(job_id(&manual), job_id(&stateless), "a savepoint does not restart the job");
    let output = harness.weir().args(["deployment", "history", "counts"]).bounded_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("MANUAL") && text.contains("UPGRADE"), "{text}");

    // Deleted: the job and cluster go, the record too.
    let output = harness.weir().args(["deployment", "delete", "counts"]).bounded_output().unwrap();
    assert!(String::from_utf8_lossy(&output.stdout).contains("deployment.weir.dev/counts deleted"), "{output:?}");
    assert!(dirs.clusters().iter().all(|(_, dir)| weir_deploy::processes::processes_of(dir).is_empty()));
}

#[test]
fn a_pre_flight_refusal_leaves_the_old_job_running_and_a_broken_release_rolls_back() {
    let harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    spec.extra_configuration = vec![
        ("kubernetes.operator.deployment.rollback.enabled", "true"),
        ("kubernetes.operator.deployment.readiness.timeout", "20s"),
    ];
    harness.apply(&spec);
    let first = harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());

    // v3 changes the counter's state type: refused before anything stops.
    spec.version = 3;
    spec.parallelism = 3;
    harness.apply(&spec);
    let refused = harness.wait("the refusal", |s| s["status"]["error"].as_str().is_some_and(|e| e.contains("refused")));
    let error = refused["status"]["error"].as_str().unwrap();
    assert!(error.contains("state 'count' of operator 'counter'") && error.contains("i64"), "{error}");
    assert!(error.contains("before anything stopped"), "{error}");
    assert_eq!(job_id(&refused), job_id(&first), "the old job was replaced");
    assert_eq!(refused["status"]["jobStatus"]["state"], "RUNNING");
    assert_eq!(refused["status"]["lifecycleState"], "STABLE");
    let counts = wait_counts_beyond(&out, &counts);

    // v4 fails on its first record: ROLLING_BACK, then ROLLED_BACK to v1 from the upgrade
    // savepoint, exactly once.
    spec.version = 4;
    spec.parallelism = 2;
    harness.apply(&spec);
    harness.wait("the upgrade to v4", |s| s["status"]["clusterInfo"]["binary"] == binary(4));
    let rolled_back = harness.wait("ROLLED_BACK", |s| {
        s["status"]["lifecycleState"] == "ROLLED_BACK" && s["status"]["jobStatus"]["state"] == "RUNNING"
    });
    assert_eq!(rolled_back["status"]["clusterInfo"]["binary"], binary(1));
    assert_eq!(rolled_back["status"]["reconciliationStatus"]["state"], "ROLLED_BACK");
    let error = rolled_back["status"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("its job FAILED") && error.contains("rolling back"), "ROLLED_BACK says why: {error:?}");
    wait_counts_beyond(&out, &counts);
    assert_eq!(harness.most_clusters_alive_at_once(), 1, "two clusters of the deployment ran at once");
}

#[test]
fn a_controller_killed_at_random_points_of_upgrades_resumes_them() {
    let rounds: u64 = std::env::var("WEIR_OPERATOR_KILL_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(10);
    let seed: u64 = std::env::var("WEIR_OPERATOR_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("WEIR_OPERATOR_KILL_SEED={seed}");
    let mut random = seed | 1;
    let mut next = move |below: u64| {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random % below
    };
    let mut harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    harness.apply(&spec);
    harness.wait_stable(1);
    let mut counts = wait_counts_beyond(&out, &BTreeMap::new());
    let kills = Arc::new(Mutex::new(Vec::new()));
    // The first rounds abort the controller at each named point between the steps of an
    // upgrade (with the mode that reaches it); the others kill it after a random delay.
    let points = [
        ("operator-after-stop-triggered", "savepoint"),
        ("operator-after-savepoint-recorded", "savepoint"),
        ("operator-after-job-cancelled", "last-state"),
        ("operator-after-cluster-stopped", "savepoint"),
        ("operator-after-cluster-started", "last-state"),
        ("operator-after-submit", "savepoint"),
    ];
    for round in 0..rounds {
        spec.parallelism = 2 + ((round + 1) % 3) as u32;
        // v1 until round 3, v2 (one more operator) from then on: going back would need -n.
        spec.version = if round >= 3 { 2 } else { 1 };
        let point = points.get(round as usize);
        spec.mode = match point {
            Some((_, mode)) => mode,
            None if next(2) == 0 => "savepoint",
            None => "last-state",
        };
        let how = match point {
            Some((name, _)) => {
                harness.kill_operator();
                harness.start_operator_with(&[("FAILPOINTS", &format!("{name}=return"))]);
                harness.apply(&spec);
                harness.wait_operator_exit();
                format!("aborted at {name}")
            }
            None => {
                harness.apply(&spec);
                let delay = Duration::from_millis(next(450));
                std::thread::sleep(delay);
                harness.kill_operator();
                format!("killed after {delay:?}")
            }
        };
        let status = harness.status();
        let step = status["status"]["operation"]["step"]["name"].as_str().unwrap_or("none").to_string();
        kills.lock().unwrap().push(format!("round {round}: {} mode, {how}, at step {step}", spec.mode));
        harness.start_operator();
        let stable = harness.wait_stable(round + 2);
        assert_eq!(stable["status"]["jobStatus"]["state"], "RUNNING");
        counts = wait_counts_beyond(&out, &counts);
    }
    eprintln!("{}", kills.lock().unwrap().join("\n"));
    // Every savepoint the history names is on disk: none was lost.
    let status = harness.status();
    for record in status["status"]["savepointHistory"].as_array().unwrap() {
        let location = record["location"].as_str().unwrap().trim_start_matches("file://");
        assert!(Path::new(location).join("_metadata").is_file(), "savepoint {location} of the history is gone");
    }
    assert_eq!(harness.most_clusters_alive_at_once(), 1, "two clusters of the deployment ran at once");
}

#[test]
fn a_bad_spec_is_refused_with_its_field_path_and_changes_nothing() {
    let harness = Harness::new();
    let mut spec = Spec::new(&harness.out("out"));
    spec.mode = "snapshot";
    let file = harness.dir.path().join("bad.yaml");
    std::fs::write(&file, spec.yaml()).unwrap();
    let output = harness.weir().args(["deployment", "apply", "-f"]).arg(&file).bounded_output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "spec.job.upgradeMode: 'snapshot' is not one of savepoint, last-state, stateless; nothing was applied"
        ),
        "{stderr}"
    );
    let output = harness.weir().args(["deployment", "get"]).bounded_output().unwrap();
    assert!(String::from_utf8_lossy(&output.stdout).contains("No deployments"), "{output:?}");
    let output = harness.weir().args(["deployment", "get", "counts"]).bounded_output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no deployment 'counts'"));
}

#[test]
fn a_deployment_whose_cluster_died_starts_again_from_its_newest_checkpoint() {
    let harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    spec.mode = "last-state";
    harness.apply(&spec);
    let first = harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());
    // Every process of the cluster dies at once, as with a machine restart.
    let dir = PathBuf::from(first["status"]["clusterInfo"]["dir"].as_str().unwrap());
    for pid in weir_deploy::processes::processes_of(&dir) {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
    let recovered = harness.wait("a new cluster", |s| {
        s["status"]["clusterInfo"]["seq"]
            .as_u64()
            .is_some_and(|seq| seq > first["status"]["clusterInfo"]["seq"].as_u64().unwrap())
            && s["status"]["jobStatus"]["state"] == "RUNNING"
            && s["status"]["jobStatus"]["ready"] == true
    });
    assert_ne!(job_id(&recovered), job_id(&first));
    assert!(
        recovered["status"]["jobStatus"]["restoredFrom"]
            .as_str()
            .unwrap()
            .contains(&format!("{}/chk-", job_id(&first))),
        "{recovered:#}"
    );
    wait_counts_beyond(&out, &counts);
}

#[test]
fn periodic_savepoints_are_trimmed_and_a_new_initial_savepoint_path_is_a_manual_rollback() {
    let harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    spec.extra_configuration = vec![
        ("kubernetes.operator.periodic.savepoint.interval", "300ms"),
        ("kubernetes.operator.savepoint.history.max.count", "2"),
    ];
    harness.apply(&spec);
    harness.wait_stable(1);
    // Periodic savepoints, the history kept at two, the older ones disposed.
    let status = harness.wait("five periodic savepoints", |s| {
        s["status"]["lastPeriodicSavepointMs"].as_u64().is_some_and(|t| t > 0)
            && std::fs::read_dir(harness.deployment_dir().join("savepoints")).is_ok_and(|d| d.count() >= 2)
            && s["status"]["savepointHistory"].as_array().is_some_and(|h| h.len() == 2)
    });
    std::thread::sleep(Duration::from_secs(2));
    let status = harness.wait("the history trimmed again", |s| {
        s["status"]["savepointHistory"].as_array().is_some_and(|h| h.len() == 2) && s != &status
    });
    assert!(status["status"]["savepointHistory"].as_array().unwrap().iter().all(|r| r["triggerType"] == "PERIODIC"));
    // Savepoints keep coming every 300 ms and each trims the history, so the history and the
    // disk are compared between two reads of the status that agree. The rollback point is
    // copied out of the deployment's directory inside the same window (a savepoint is
    // relocatable), since the trimming goes on until the upgrade stops the job.
    let rollback_point = harness.dir.path().join("rollback-point");
    let history = |s: &Value| -> Vec<String> {
        s["status"]["savepointHistory"]
            .as_array()
            .map(|h| {
                h.iter()
                    .filter_map(|r| r["location"].as_str())
                    .map(|l| l.trim_start_matches("file://").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let before = harness.status();
        let kept = history(&before);
        let on_disk: Vec<PathBuf> = std::fs::read_dir(harness.deployment_dir().join("savepoints"))
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("_metadata").is_file())
            .collect();
        let _ = std::fs::remove_dir_all(&rollback_point);
        let copied = kept.first().is_some_and(|k| copy_dir(Path::new(k), &rollback_point).is_ok());
        // A periodic savepoint may complete and trim the oldest between two reads: only a
        // history that stayed the same while its savepoints were all there is checked.
        let all_there = kept.iter().all(|k| Path::new(k).join("_metadata").is_file());
        let after = harness.status();
        if kept.len() == 2 && history(&after) == kept && copied && all_there {
            // About ten were taken; the two of the history are there, and at most one more
            // (completed while the disk was listed, not yet in the history).
            assert!(on_disk.len() <= 3, "the disposed savepoints are still there: {on_disk:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no two agreeing reads of the savepoint history in {WAIT_MAX:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_counts_beyond(&out, &BTreeMap::new());

    // The lesson's manual rollback: the spec names a savepoint to start from.
    let savepoint = format!("file://{}", rollback_point.display());
    spec.extra_configuration.clear();
    spec.parallelism = 3;
    let text = spec
        .yaml()
        .replace("    state: running\n", &format!("    state: running\n    initialSavepointPath: {savepoint}\n"));
    std::fs::write(harness.dir.path().join("counts.yaml"), &text).unwrap();
    let file = harness.dir.path().join("counts.yaml");
    let output = harness.weir().args(["deployment", "apply", "-f"]).arg(&file).bounded_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let restored = harness.wait_stable(2);
    assert_eq!(restored["status"]["jobStatus"]["restoredFrom"], savepoint.as_str());
    // (Restoring an older savepoint writes again what came after it, as the lesson says: no
    // exactly-once check of the output here.)
}

#[test]
fn last_state_without_any_checkpoint_needs_a_manual_restore_and_touches_nothing() {
    let harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    spec.mode = "last-state";
    let text = spec.yaml().replace("    execution.checkpointing.interval: 300ms\n", "");
    std::fs::write(harness.dir.path().join("counts.yaml"), &text).unwrap();
    let file = harness.dir.path().join("counts.yaml");
    let output = harness.weir().args(["deployment", "apply", "-f"]).arg(&file).bounded_output().unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("last-state without execution.checkpointing.interval"));
    let first = harness.wait("RUNNING", |s| s["status"]["lifecycleState"] == "STABLE");
    let text = text.replace("parallelism: 2", "parallelism: 3");
    std::fs::write(&file, &text).unwrap();
    harness.weir().args(["deployment", "apply", "-f"]).arg(&file).bounded_output().unwrap();
    let refused = harness
        .wait("the refusal", |s| s["status"]["error"].as_str().is_some_and(|e| e.contains("Manual restore required")));
    assert_eq!(job_id(&refused), job_id(&first));
    assert_eq!(refused["status"]["jobStatus"]["state"], "RUNNING", "the job was touched: {refused:#}");
    assert_eq!(refused["status"]["lifecycleState"], "FAILED");
}

#[test]
fn a_release_that_crashes_at_start_rolls_back_after_the_readiness_timeout_from_the_upgrade_savepoint() {
    let harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    spec.extra_configuration = vec![
        ("kubernetes.operator.deployment.rollback.enabled", "true"),
        ("kubernetes.operator.deployment.readiness.timeout", "3s"),
        // The crashing job restarts (and waits for TaskManagers) instead of failing: only the
        // readiness timeout can end it.
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "1000"),
        ("restart-strategy.fixed-delay.delay", "200ms"),
    ];
    harness.apply(&spec);
    harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());

    // v4 --crash-at-start: its pre-flight passes (it runs no job), then every process that
    // runs its job exits at the first record.
    spec.version = 4;
    spec.flags = vec!["--crash-at-start"];
    let applied = Instant::now();
    harness.apply(&spec);
    let upgraded = harness.wait("the upgrade to v4", |s| {
        s["status"]["clusterInfo"]["binary"] == binary(4) && s["status"].get("operation").is_none()
    });
    let savepoint = upgraded["status"]["jobStatus"]["upgradeSavepointPath"].as_str().unwrap().to_string();
    assert_eq!(upgraded["status"]["jobStatus"]["restoredFrom"], savepoint.as_str(), "{upgraded:#}");
    assert_eq!(upgraded["status"]["lifecycleState"], "DEPLOYED", "{upgraded:#}");
    let rolled_back = harness.wait("ROLLED_BACK", |s| {
        s["status"]["lifecycleState"] == "ROLLED_BACK"
            && s["status"]["jobStatus"]["state"] == "RUNNING"
            && s["status"]["jobStatus"]["ready"] == true
    });
    assert!(applied.elapsed() >= Duration::from_secs(3), "rolled back before the readiness timeout");
    let log = operator_log(&harness);
    assert!(log.contains("did not get ready within the readiness timeout (3s): rolling back"), "{log}");
    assert_eq!(rolled_back["status"]["clusterInfo"]["binary"], binary(1));
    assert_eq!(rolled_back["status"]["reconciliationStatus"]["state"], "ROLLED_BACK");
    // Back to v1 from the upgrade savepoint, which stays in the history.
    assert_eq!(rolled_back["status"]["jobStatus"]["restoredFrom"], savepoint.as_str(), "{rolled_back:#}");
    assert_eq!(history_locations(&rolled_back), vec![savepoint.clone()]);
    assert_eq!(rolled_back["status"]["savepointHistory"][0]["triggerType"], "UPGRADE");
    // Exactly once: every user's committed counts go on 1, 2, 3, ... (committed_counts checks).
    wait_counts_beyond(&out, &counts);
    assert_eq!(harness.most_clusters_alive_at_once(), 1, "two clusters of the deployment ran at once");
}

#[test]
fn a_rollback_after_the_failed_job_checkpointed_starts_from_that_checkpoint_without_the_operator_it_added() {
    let mut harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    spec.extra_configuration = vec![("kubernetes.operator.deployment.rollback.enabled", "true")];
    harness.apply(&spec);
    let first = harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());

    // The upgrade to v2 (one more stateful operator, `enrich`) while nobody watches: the
    // controller dies right after submitting, so the new spec never becomes stable.
    harness.kill_operator();
    harness.start_operator_with(&[("FAILPOINTS", "operator-after-submit=return")]);
    spec.version = 2;
    spec.parallelism = 3;
    harness.apply(&spec);
    harness.wait_operator_exit();
    let status = harness.status();
    let dir = PathBuf::from(status["status"]["clusterInfo"]["dir"].as_str().unwrap());
    let api =
        weir_deploy::cluster_api::ClusterApi::new(status["status"]["clusterInfo"]["restAddress"].as_str().unwrap());
    let deadline = Instant::now() + WAIT_MAX;
    let v2_job = loop {
        let job = api.jobs().ok().and_then(|jobs| jobs.first().map(|(id, _)| id.clone()));
        if let Some(id) = job
            && api.job(&id).ok().flatten().is_some_and(|v| v.completed_checkpoints >= 2)
        {
            break id;
        }
        assert!(Instant::now() < deadline, "the v2 job completed no checkpoints");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(v2_job, job_id(&first));
    // v2 committed counts of its own...
    let counts = wait_counts_beyond(&out, &counts);
    // ...then its TaskManagers die and (restart-strategy none) its job FAILS.
    kill_taskmanagers(&dir);
    let deadline = Instant::now() + WAIT_MAX;
    while api.job(&v2_job).ok().flatten().is_none_or(|v| v.state != "FAILED") {
        assert!(Instant::now() < deadline, "the v2 job did not fail");
        std::thread::sleep(Duration::from_millis(50));
    }
    harness.start_operator();
    let rolled_back = harness.wait("ROLLED_BACK", |s| {
        s["status"]["lifecycleState"] == "ROLLED_BACK"
            && s["status"]["jobStatus"]["state"] == "RUNNING"
            && s["status"]["jobStatus"]["ready"] == true
    });
    assert_eq!(rolled_back["status"]["clusterInfo"]["binary"], binary(1));
    // From v2's newest checkpoint, not the upgrade savepoint: nothing v2 committed is
    // written again. v1 has no `enrich`: its state is dropped (-n).
    let restored = rolled_back["status"]["jobStatus"]["restoredFrom"].as_str().unwrap();
    assert!(restored.contains(&format!("/{v2_job}/chk-")), "{rolled_back:#}");
    let log = operator_log(&harness);
    assert!(log.contains("dropping the state of the operators only the failed spec has (enrich) (-n)"), "{log}");
    wait_counts_beyond(&out, &counts);
}

#[test]
fn a_savepoint_upgrade_of_a_failed_job_falls_back_to_its_newest_checkpoint_or_needs_a_manual_restore() {
    // With a checkpoint: the upgrade starts from it (last-state-fallback, on by default).
    let harness = Harness::new();
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    harness.apply(&spec);
    let first = harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());
    kill_taskmanagers(Path::new(first["status"]["clusterInfo"]["dir"].as_str().unwrap()));
    let failed = harness.wait("FAILED", |s| s["status"]["lifecycleState"] == "FAILED");
    assert_eq!(failed["status"]["jobStatus"]["state"], "FAILED");
    let counts_at_failure = committed_counts(&out);
    assert!(counts_at_failure.values().zip(counts.values()).all(|(now, before)| now.1 >= before.1));
    spec.parallelism = 3;
    harness.apply(&spec);
    let upgraded = harness.wait_stable(2);
    let restored = upgraded["status"]["jobStatus"]["restoredFrom"].as_str().unwrap();
    assert!(restored.contains(&format!("/{}/chk-", job_id(&first))), "{upgraded:#}");
    // No savepoint could be taken of a failed job.
    assert!(history_locations(&upgraded).is_empty(), "{upgraded:#}");
    wait_counts_beyond(&out, &counts_at_failure);
    drop(harness);

    // Without any checkpoint: nothing to start from; the status says so and nothing changes.
    let harness = Harness::new();
    let mut spec = Spec::new(&harness.out("out"));
    let file = harness.dir.path().join("counts.yaml");
    std::fs::write(&file, spec.yaml().replace("    execution.checkpointing.interval: 300ms\n", "")).unwrap();
    let output = harness.weir().args(["deployment", "apply", "-f"]).arg(&file).bounded_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let first = harness.wait("STABLE", |s| s["status"]["lifecycleState"] == "STABLE");
    kill_taskmanagers(Path::new(first["status"]["clusterInfo"]["dir"].as_str().unwrap()));
    harness.wait("FAILED", |s| s["status"]["jobStatus"]["state"] == "FAILED");
    spec.parallelism = 3;
    std::fs::write(&file, spec.yaml().replace("    execution.checkpointing.interval: 300ms\n", "")).unwrap();
    harness.weir().args(["deployment", "apply", "-f"]).arg(&file).bounded_output().unwrap();
    let refused = harness
        .wait("the refusal", |s| s["status"]["error"].as_str().is_some_and(|e| e.contains("Manual restore required")));
    assert_eq!(refused["status"]["lifecycleState"], "FAILED", "{refused:#}");
    assert_eq!(job_id(&refused), job_id(&first));
    // The error stays (the failed job does not overwrite it), and the deployed spec is still
    // the old one: nothing of the new one ran.
    std::thread::sleep(Duration::from_millis(500));
    let later = harness.status();
    assert!(later["status"]["error"].as_str().unwrap().contains("Manual restore required"), "{later:#}");
    assert_eq!(later["status"]["lifecycleState"], "FAILED", "{later:#}");
    assert_eq!(later["status"]["reconciliationStatus"]["lastReconciledSpec"]["job"]["parallelism"], 2);
    assert!(refused["status"].get("operation").is_none(), "{refused:#}");
    let dirs = weir_deploy::processes::DeploymentDirs::new(harness.deployment_dir());
    assert_eq!(dirs.clusters().len(), 1, "a new cluster was started");
}

/// A deployment whose job restarts for ever once its TaskManagers are gone (nothing to run
/// it on): its spec, its first status, the counts it committed before, and its status now
/// that its job is not running.
fn restarting_job(harness: &Harness, out: &Path) -> (Spec, Value, BTreeMap<u64, (u64, u64)>, Value) {
    let mut spec = Spec::new(out);
    spec.extra_configuration = vec![
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "100000"),
        // Long enough for the controller (every 100 ms) to see it RESTARTING.
        ("restart-strategy.fixed-delay.delay", "1s"),
    ];
    harness.apply(&spec);
    let first = harness.wait_stable(1);
    let counts = wait_counts_beyond(out, &BTreeMap::new());
    kill_taskmanagers(Path::new(first["status"]["clusterInfo"]["dir"].as_str().unwrap()));
    let restarting = harness.wait("a job that is not running", |s| {
        s["status"]["jobStatus"]["state"].as_str().is_some_and(|state| state != "RUNNING")
    });
    (spec, first, counts, restarting)
}

#[test]
fn a_savepoint_upgrade_of_a_restarting_job_falls_back_to_its_newest_checkpoint_at_once() {
    let harness = Harness::new();
    let out = harness.out("out");
    let (mut spec, first, counts, restarting) = restarting_job(&harness, &out);
    let state = restarting["status"]["jobStatus"]["state"].as_str().unwrap().to_string();
    assert_ne!(state, "FAILED", "{restarting:#}");
    let counts_before = committed_counts(&out);
    assert!(counts_before.values().zip(counts.values()).all(|(now, before)| now.1 >= before.1));
    spec.parallelism = 3;
    let applied = Instant::now();
    harness.apply(&spec);
    // At once: no stop-with-savepoint is tried (and retried for 30 s) on a job that cannot
    // take one. Timed to the decision, not to STABLE: the whole upgrade (a new cluster, the
    // job's first checkpoint) took 21.5 s once in CI with this file's tests sharing 2 cores.
    harness.wait("the last-state fallback", |_| operator_log(&harness).contains("last-state fallback, cancelling it"));
    assert!(applied.elapsed() < Duration::from_secs(20), "the fallback was decided after {:?}", applied.elapsed());
    let upgraded = harness.wait_stable(2);
    let restored = upgraded["status"]["jobStatus"]["restoredFrom"].as_str().unwrap();
    assert!(restored.contains(&format!("/{}/chk-", job_id(&first))), "{upgraded:#}");
    assert!(history_locations(&upgraded).is_empty(), "{upgraded:#}");
    assert!(operator_log(&harness).contains("last-state fallback, cancelling it"), "{}", operator_log(&harness));
    wait_counts_beyond(&out, &counts_before);
}

/// A savepoint-mode suspend of a job that is not running falls back to last-state (cancel,
/// keep the newest checkpoint), and the resume starts from that checkpoint. The controller's
/// next pass over the suspended deployment used to record the spec's savepoint mode as the
/// suspend's, and the resume then started empty (the deployment simulation found it).
#[test]
fn a_savepoint_suspend_of_a_restarting_job_resumes_from_its_newest_checkpoint() {
    let harness = Harness::new();
    let out = harness.out("out");
    let (mut spec, first, _, _) = restarting_job(&harness, &out);
    spec.state = "suspended";
    harness.apply(&spec);
    let suspended = harness.wait("SUSPENDED", |s| s["status"]["lifecycleState"] == "SUSPENDED");
    assert!(operator_log(&harness).contains("last-state fallback, cancelling it"), "{}", operator_log(&harness));
    // Passes over the suspended deployment change nothing of what the resume starts from.
    std::thread::sleep(Duration::from_millis(500));
    let at_suspend = committed_counts(&out);
    spec.state = "running";
    harness.apply(&spec);
    let resumed = harness.wait_stable(3);
    let restored = resumed["status"]["jobStatus"]["restoredFrom"].as_str().unwrap_or_default();
    assert!(restored.contains(&format!("/{}/chk-", job_id(&first))), "{suspended:#}\n{resumed:#}");
    wait_counts_beyond(&out, &at_suspend);
}
