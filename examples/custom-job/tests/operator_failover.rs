//! Two `my-weir operator`s on one etcd store (`high-availability.type: etcd`): the leader is
//! frozen (SIGSTOP) in the middle of an upgrade, the standby takes over and finishes it, and
//! the old leader is woken long after its lease expired. It must make no further write and no
//! process action (no stale status over its successor's, no cluster stopped, no job restarted
//! from the old job's checkpoint), then stand by and lead again when the other one dies. The
//! counts stay exactly once throughout.

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const CLUSTER_ID: &str = "fencing";

/// The pid of the operator etcd names as the leader (`operator-<pid>`), once there is one.
fn operator_leader(etcd: &weir_ha::EtcdClient) -> Option<u32> {
    let election = weir_deploy::lock::election(Arc::new(clone_client(etcd)), CLUSTER_ID);
    let (info, _) = election.leader().ok()??;
    info.id.strip_prefix("operator-")?.parse().ok()
}

fn clone_client(etcd: &weir_ha::EtcdClient) -> weir_ha::EtcdClient {
    weir_ha::EtcdClient::new(etcd.endpoints(), Duration::from_secs(2))
}

fn wait_leader(etcd: &weir_ha::EtcdClient, pid: u32) {
    let deadline = Instant::now() + WAIT_MAX;
    while operator_leader(etcd) != Some(pid) {
        assert!(
            Instant::now() < deadline,
            "operator {pid} did not lead within {WAIT_MAX:?}; leader: {:?}",
            operator_leader(etcd)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Ends a second operator however the test ends (woken first, if it was frozen).
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.id().to_string()]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a leader that took over must keep: the job, its cluster and the upgrade savepoint.
fn settled(status: &Value) -> (String, Value, Value) {
    let s = &status["status"];
    (job_id(status), s["clusterInfo"]["seq"].clone(), s["jobStatus"]["upgradeSavepointPath"].clone())
}

#[test]
fn an_operator_frozen_mid_upgrade_wakes_after_the_takeover_and_changes_nothing() {
    let etcd_server = weir_ha::testing::EtcdServer::start();
    let etcd = weir_ha::EtcdClient::new(&[etcd_server.endpoint()], Duration::from_secs(2));
    let storage = tempfile::tempdir().unwrap();
    let config = format!(
        "high-availability.type: etcd\nhigh-availability.etcd.endpoints: {}\nhigh-availability.cluster-id: {CLUSTER_ID}\nhigh-availability.storageDir: file://{}\n",
        etcd_server.endpoint(),
        storage.path().display()
    );
    // The first operator leads; its second pre-flight (the upgrade's: the first is the
    // deploy's) is held for 4 s, so the test freezes it there.
    let mut harness = Harness::with_configuration(Some(&config));
    harness.kill_operator();
    harness.start_operator_with(&[("FAILPOINTS", "operator-in-pre-flight=1*off->sleep(4000)")]);
    let first = harness.operator.as_ref().unwrap().id();
    wait_leader(&etcd, first);
    let second = Operator(harness.spawn_operator("operator-2.log", &[]));

    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    harness.apply(&spec);
    harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());

    // The upgrade p 2 -> 3, savepoint mode; freeze the leader in its pre-flight.
    spec.parallelism = 3;
    harness.apply(&spec);
    harness.wait("the upgrade's pre-flight", |s| s["status"]["operation"]["step"]["name"] == "preFlight");
    signal(first, "STOP");
    let frozen_at = Instant::now();

    // The standby leads and finishes the upgrade.
    wait_leader(&etcd, second.0.id());
    let upgraded = harness.wait_stable(2);
    let taken_over = settled(&upgraded);
    assert!(taken_over.2.is_string(), "the upgrade recorded no savepoint: {upgraded:#}");
    let counts = wait_counts_beyond(&out, &counts);

    // Wake the old leader 8 s after it froze, well past its 2 s lease.
    std::thread::sleep(Duration::from_secs(8).saturating_sub(frozen_at.elapsed()));
    signal(first, "CONT");
    let watch_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < watch_until {
        let status = harness.status();
        if status.is_null() {
            continue;
        }
        assert_eq!(
            settled(&status),
            taken_over,
            "the woken operator changed the deployment the new leader had upgraded: {status:#}"
        );
        assert!(
            history_locations(&status).iter().any(|l| Some(l.as_str()) == taken_over.2.as_str()),
            "the upgrade savepoint vanished from the history: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let counts = wait_counts_beyond(&out, &counts);
    assert_eq!(harness.most_clusters_alive_at_once(), 1, "two clusters of the deployment ran at once");
    let woken = harness.operator.as_mut().unwrap();
    assert!(woken.try_wait().unwrap().is_none(), "the woken operator exited instead of standing by");
    let log = operator_log(&harness);
    assert!(log.contains("lost the leadership"), "the woken operator did not notice its lost lease:\n{log}");

    // It stands by: when the other operator dies, it leads again and reconciles.
    drop(second);
    wait_leader(&etcd, first);
    spec.parallelism = 2;
    harness.apply(&spec);
    harness.wait_stable(3);
    wait_counts_beyond(&out, &counts);
    assert_eq!(harness.most_clusters_alive_at_once(), 1, "two clusters of the deployment ran at once");
}

/// xorshift64: reproducible delays from a printed seed.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Rounds of upgrades (parallelism and mode change each round) with two operators on one
/// etcd store: the leader is frozen at a random moment of the upgrade and woken at a random
/// time later, before or after its lease expired (so sometimes it leads on, sometimes the
/// other one has taken over). Whoever leads finishes every upgrade; the counts stay exactly
/// once, no two clusters of the deployment ever run at once, and both operators survive.
/// `WEIR_OPERATOR_FREEZE_SEED` replays a run, `WEIR_OPERATOR_FREEZE_ROUNDS` sets the rounds.
#[test]
fn operators_frozen_and_woken_at_random_points_of_upgrades_never_act_twice() {
    let rounds: u64 = std::env::var("WEIR_OPERATOR_FREEZE_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(4);
    let seed: u64 = std::env::var("WEIR_OPERATOR_FREEZE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("WEIR_OPERATOR_FREEZE_SEED={seed}");
    let mut random = Random(seed | 1);
    let etcd_server = weir_ha::testing::EtcdServer::start();
    let etcd = weir_ha::EtcdClient::new(&[etcd_server.endpoint()], Duration::from_secs(2));
    let storage = tempfile::tempdir().unwrap();
    let config = format!(
        "high-availability.type: etcd\nhigh-availability.etcd.endpoints: {}\nhigh-availability.cluster-id: {CLUSTER_ID}\nhigh-availability.storageDir: file://{}\n",
        etcd_server.endpoint(),
        storage.path().display()
    );
    let mut harness = Harness::with_configuration(Some(&config));
    wait_leader(&etcd, harness.operator.as_ref().unwrap().id());
    let mut other = Operator(harness.spawn_operator("operator-2.log", &[]));
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    harness.apply(&spec);
    harness.wait_stable(1);
    let mut counts = wait_counts_beyond(&out, &BTreeMap::new());
    let mut story = Vec::new();
    for round in 0..rounds {
        spec.parallelism = 2 + ((round + 1) % 3) as u32;
        spec.mode = if random.below(2) == 0 { "savepoint" } else { "last-state" };
        let frozen_after = Duration::from_millis(random.below(300));
        let woken_after = Duration::from_millis(500 + random.below(5500));
        let leader = operator_leader(&etcd).expect("an operator leads");
        harness.apply(&spec);
        std::thread::sleep(frozen_after);
        signal(leader, "STOP");
        // The frozen leader changes nothing more, and a standby takes over only after its
        // lease: this is the step it was frozen in.
        let step = harness.status()["status"]["operation"]["step"]["name"].as_str().unwrap_or("none").to_string();
        story.push(format!(
            "round {round}: {} mode, leader {leader} frozen {frozen_after:?} after the apply (step {step}), woken {woken_after:?} later",
            spec.mode
        ));
        std::thread::sleep(woken_after);
        signal(leader, "CONT");
        let stable = harness.wait_stable(round + 2);
        let settled_state = settled(&stable);
        counts = wait_counts_beyond(&out, &counts);
        // Whoever lost the lease while frozen makes no change once woken.
        std::thread::sleep(Duration::from_secs(2));
        let later = harness.status();
        assert_eq!(
            settled(&later),
            settled_state,
            "{}\nthe deployment changed after it was stable: {later:#}",
            story.join("\n")
        );
        assert_eq!(later["metadata"]["generation"], round + 2);
        let main = harness.operator.as_mut().unwrap();
        assert!(main.try_wait().unwrap().is_none(), "{}\nan operator exited", story.join("\n"));
        assert!(other.0.try_wait().unwrap().is_none(), "{}\nan operator exited", story.join("\n"));
    }
    eprintln!("{}", story.join("\n"));
    wait_counts_beyond(&out, &counts);
    assert_eq!(
        harness.most_clusters_alive_at_once(),
        1,
        "{}\ntwo clusters of the deployment ran at once",
        story.join("\n")
    );
}

/// SIGTERM of the leading operator: it stops at its next step, releases its leadership at once
/// (the lease is revoked, not left to expire) and exits 0; the standby leads and carries on.
/// The deployment's cluster keeps running throughout.
#[test]
fn an_operator_stopped_with_sigterm_hands_over_at_once_and_leaves_the_job_running() {
    let etcd_server = weir_ha::testing::EtcdServer::start();
    let etcd = weir_ha::EtcdClient::new(&[etcd_server.endpoint()], Duration::from_secs(2));
    let storage = tempfile::tempdir().unwrap();
    let config = format!(
        "high-availability.type: etcd\nhigh-availability.etcd.endpoints: {}\nhigh-availability.cluster-id: {CLUSTER_ID}\nhigh-availability.storageDir: file://{}\n",
        etcd_server.endpoint(),
        storage.path().display()
    );
    let mut harness = Harness::with_configuration(Some(&config));
    let first = harness.operator.as_ref().unwrap().id();
    wait_leader(&etcd, first);
    let second = Operator(harness.spawn_operator("operator-2.log", &[]));
    let out = harness.out("out");
    let mut spec = Spec::new(&out);
    harness.apply(&spec);
    let stable = harness.wait_stable(1);
    let counts = wait_counts_beyond(&out, &BTreeMap::new());

    let stopped_at = Instant::now();
    signal(first, "TERM");
    wait_leader(&etcd, second.0.id());
    let handed_over = stopped_at.elapsed();
    eprintln!("the standby operator leads {handed_over:?} after the leader's SIGTERM");
    // By expiry it would take the lease's 2 s at least.
    assert!(handed_over < Duration::from_millis(1800), "the standby led only after {handed_over:?}");
    let status = harness.operator.as_mut().unwrap().wait().unwrap();
    assert!(status.success(), "the stopped operator exited with {status}");
    harness.operator = None;
    assert!(operator_log(&harness).contains("released its leadership"));
    // The job ran on while no operator led; the new leader upgrades it.
    assert_eq!(job_id(&harness.status()), job_id(&stable));
    let counts = wait_counts_beyond(&out, &counts);
    spec.parallelism = 3;
    harness.apply(&spec);
    harness.wait_stable(2);
    wait_counts_beyond(&out, &counts);
}
