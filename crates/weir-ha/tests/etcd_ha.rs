//! Leader election and the HA store against a real etcd (started by the test).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use weir_ha::testing::EtcdServer;
use weir_ha::{HaError, HaServices, HaSettings, JobResult, LeaderInfo};

fn services(etcd: &EtcdServer, blobs: &std::path::Path) -> HaServices {
    HaServices::connect(HaSettings {
        endpoints: vec![etcd.endpoint()],
        cluster_id: "test".into(),
        storage_dir: blobs.display().to_string(),
        lease_ttl: Duration::from_secs(2),
        kubernetes: None,
    })
    .unwrap()
}

fn info(id: &str) -> LeaderInfo {
    LeaderInfo { id: id.into(), rest_address: format!("{id}:8081"), rpc_address: format!("{id}:6123") }
}

#[test]
fn one_leader_at_a_time_and_a_standby_takes_over_when_the_lease_ends() {
    let etcd = EtcdServer::start();
    let blobs = tempfile::tempdir().unwrap();
    let first = services(&etcd, blobs.path());
    let stop = AtomicBool::new(false);
    let leader = first.election().campaign(&info("a"), &stop).unwrap().unwrap();
    assert_eq!(first.leader().unwrap().unwrap(), (info("a"), leader.epoch()));

    // A second contender waits while the first holds the lease.
    let second = Arc::new(services(&etcd, blobs.path()));
    let contender = Arc::clone(&second);
    let waiting = std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        contender.election().campaign(&info("b"), &stop).unwrap().unwrap()
    });
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!waiting.is_finished(), "two leaders at once");
    assert!(leader.guard().is_held());

    // The leader resigns (as if it died, without the wait for the lease): b is elected with
    // a higher epoch, and a's writes are refused.
    let old_guard = leader.guard();
    let old_store = first.store(old_guard.clone());
    let started = Instant::now();
    leader.resign();
    let next = waiting.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert!(next.epoch() > old_guard.epoch());
    assert!(!old_guard.is_held());
    assert!(matches!(old_store.job("j").set_next_checkpoint_id(5), Err(HaError::LostLeadership)));
}

#[test]
fn a_leader_whose_key_went_writes_nothing_and_learns_it_lost() {
    let etcd = EtcdServer::start();
    let blobs = tempfile::tempdir().unwrap();
    let ha = services(&etcd, blobs.path());
    let stop = AtomicBool::new(false);
    let leader = ha.election().campaign(&info("a"), &stop).unwrap().unwrap();
    let guard = leader.guard();
    let store = ha.store(guard.clone());
    store.job("j").set_next_checkpoint_id(3).unwrap();
    // The leader key goes behind the leader's back (as when its lease expired while the
    // process was frozen) and another JobManager is elected.
    let delete = weir_ha::etcd::Op::Delete { key: "/weir/test/leader".into(), prefix: false };
    ha.client().txn(&[], &[delete], &[]).unwrap();
    let other = services(&etcd, blobs.path());
    let next = other.election().campaign(&info("b"), &stop).unwrap().unwrap();
    assert!(next.epoch() > guard.epoch());
    // The old leader's writes are refused, and from then on it knows it lost.
    assert!(matches!(store.job("j").set_next_checkpoint_id(9), Err(HaError::LostLeadership)));
    assert!(!guard.is_held());
    // Its renewal thread finds the key taken too.
    assert!(leader.wait_lost(Duration::from_secs(3)));
    let recovered = other.store(next.guard()).recoverable_jobs().unwrap();
    assert!(recovered.is_empty(), "no submission was recorded, so nothing to recover");
}

#[test]
fn jobs_counters_checkpoints_and_results_survive_a_leader() {
    let etcd = EtcdServer::start();
    let blobs = tempfile::tempdir().unwrap();
    let ha = services(&etcd, blobs.path());
    let stop = AtomicBool::new(false);
    let leader = ha.election().campaign(&info("a"), &stop).unwrap().unwrap();
    let store = ha.store(leader.guard());
    let job = "0123456789abcdef0123456789abcdef";
    store.record_submission(job, br#"{"job":"counter"}"#).unwrap();
    let job_store = store.job(job);
    job_store.set_next_checkpoint_id(8).unwrap();
    job_store.set_next_attempt(3).unwrap();
    job_store.add_checkpoint(5, "file:///c/chk-5", &[]).unwrap();
    job_store.add_checkpoint(7, "file:///c/chk-7", &[5]).unwrap();
    job_store.add_savepoint_request("req-1", true).unwrap();
    leader.resign();

    let next = services(&etcd, blobs.path());
    let leader = next.election().campaign(&info("b"), &stop).unwrap().unwrap();
    let store = next.store(leader.guard());
    let jobs = store.recoverable_jobs().unwrap();
    assert_eq!(jobs.len(), 1);
    let recovered = &jobs[0];
    assert_eq!(recovered.job_id, job);
    assert_eq!(recovered.submission, br#"{"job":"counter"}"#);
    assert_eq!(recovered.next_checkpoint_id, 8);
    assert_eq!(recovered.next_attempt, 3);
    assert_eq!(recovered.checkpoints, vec![(7, "file:///c/chk-7".to_string())]);
    assert_eq!(recovered.savepoints, vec!["req-1".to_string()]);

    let result = JobResult {
        job_id: job.into(),
        state: "FINISHED".into(),
        end_time_ms: 1,
        failure: None,
        job_name: Some("counter".into()),
    };
    store.job(job).finish(&result).unwrap();
    assert!(store.recoverable_jobs().unwrap().is_empty());
    assert_eq!(store.results().unwrap(), vec![result]);
    assert!(!blobs.path().join("test/submissions").join(format!("{job}.json")).exists());
}
