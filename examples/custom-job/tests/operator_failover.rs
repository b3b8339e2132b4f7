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
