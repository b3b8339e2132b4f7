//! weir across machines (issue 26): real processes on the hosts of the multi-host test bed
//! (`common/netns.rs`), etcd on one host, two HA JobManagers on two others and three
//! TaskManagers on the rest, each bound to its own host's address; faults injected from
//! outside. One test per fault shape:
//!
//! - a TaskManager cut off from the JobManagers but not from its peers (it stops its subtasks
//!   after `heartbeat.timeout`, the job runs elsewhere, it re-registers after the heal);
//! - the leader cut off from etcd but not from the TaskManagers (it stops acting before its
//!   lease can expire, a standby takes the job over without restarting a task);
//! - one-way partitions between a TaskManager and the leader, both ways;
//! - `kill -9` and SIGSTOP/SIGCONT of every process kind, etcd included, writing to Kafka;
//! - a random schedule of at least 50 faults (partitions, one-way partitions, isolation,
//!   loss, kills, freezes, and their heals; seeded: `WEIR_MULTI_HOST_SEED` replays a run).
//!
//! Each checks the output is exactly once and the job RUNNING again (or FINISHED) once the
//! fault healed, without anyone acting. The `#[ignore]`d `bench_*` tests are the
//! measurements of BENCHMARKS.md ("Across machines"), run by `bench/multi-host.sh`: speed is
//! measured there, never asserted here. Needs root, iproute2, iptables and etcd (and
//! noida-db for Kafka); `.ci/test` installs them.

mod common;
#[path = "common/hosts.rs"]
mod hosts;
#[allow(dead_code)]
#[path = "common/kafka.rs"]
mod kafka;
#[path = "common/netns.rs"]
mod netns;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{assert_counts_exactly_once, committed_lines};
use hosts::{HostCluster, Layout, committed_parts, get_json, post_json};

/// One cluster at a time: six hosts of processes share the two cores of a CI machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `heartbeat.timeout` of the clusters here (`hosts.rs` sets it).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a JobManager heartbeats its TaskManagers: a fifth of the timeout.
const HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);
/// The users of every counter job here.
const USERS: u64 = 20;
/// Longest any single step waits.
const STEP_MAX: Duration = Duration::from_secs(30);

/// Two JobManagers and three TaskManagers with 2 slots each on hosts 1 to 5, etcd on host 0.
fn cluster() -> HostCluster {
    HostCluster::start(Layout::spread(2, 3, 0), &[])
}

/// `-p 2 counter` of `events` generated events at `rate` per second into `output`.
fn counter(output: &str, events: u64, rate: u64) -> Vec<String> {
    ["-p", "2", "counter", "--users", &USERS.to_string(), "--events", &events.to_string()]
        .into_iter()
        .map(str::to_string)
        .chain(["--rate".to_string(), rate.to_string(), "--output".to_string(), output.to_string()])
        .collect()
}

fn submit(cluster: &HostCluster, args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cluster.submit(&args)
}

/// Waits until the job is RUNNING with every subtask RUNNING and none on the TaskManager
/// `id`; how long after `since`.
fn running_without(cluster: &HostCluster, job: &str, id: &str, since: Instant, within: Duration) -> Duration {
    let deadline = since + within;
    loop {
        if let Some((state, all)) = cluster.job_status(job)
            && state == "RUNNING"
            && all
            && !cluster.subtask_taskmanagers(job).contains(id)
        {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "job {job} not RUNNING without TaskManager {id} within {within:?}: {:?}\n{}",
            cluster.job_status(job),
            cluster.tails(30)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// No checkpoint was completed by two JobManager processes: two leaders never both acted.
fn assert_one_leader_per_checkpoint(cluster: &HostCluster) -> usize {
    let mut by_id: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for (id, jobmanager, _) in cluster.completed_checkpoints() {
        by_id.entry(id).or_default().insert(jobmanager);
    }
    for (id, jobmanagers) in &by_id {
        assert_eq!(jobmanagers.len(), 1, "checkpoint {id} was completed by two JobManagers: {jobmanagers:?}");
    }
    by_id.len()
}

/// The TaskManager's "registered at" lines naming `rpc`, read after `since`.
fn registrations_at(cluster: &HostCluster, rpc: &str, since: Instant) -> usize {
    let marker = format!("registered at {rpc} ");
    cluster.taskmanagers.iter().flatten().map(|tm| tm.process.lines_with(&marker, since).len()).sum()
}

#[test]
fn every_process_binds_and_advertises_its_own_hosts_address() {
    let _serial = serial();
    let cluster = cluster();
    let out = cluster.output("out");
    let job = submit(&cluster, &counter(out.to_str().unwrap(), 6000, 3000));
    cluster.wait_running(&job, STEP_MAX);
    let (leader, _) = cluster.wait_for_leader(None, STEP_MAX);
    let leader_ip = cluster.host_ip(cluster.layout.jobmanagers[leader]).to_string();

    // etcd's leader record: the leader's own address, never a bind or loopback address.
    let (info, _) = cluster.leader().expect("a leader in etcd");
    assert_eq!(info.rest_address, format!("{leader_ip}:{}", hosts::REST_PORT));
    assert_eq!(info.rpc_address, format!("{leader_ip}:{}", hosts::RPC_PORT));
    // Each TaskManager advertises the address of the interface that reaches the JobManager
    // (taskmanager.host unset): its host's, as it says and as the leader lists it.
    let listed = cluster.get("/taskmanagers").expect("the leader lists its TaskManagers");
    let paths: BTreeSet<String> = listed["taskmanagers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tm| tm["path"].as_str().map(str::to_string))
        .collect();
    let expected: BTreeSet<String> =
        cluster.layout.taskmanagers.iter().map(|&h| format!("{}:{}", cluster.host_ip(h), hosts::DATA_PORT)).collect();
    assert_eq!(paths, expected, "the TaskManagers' data addresses");
    for (index, tm) in cluster.taskmanagers.iter().flatten().enumerate() {
        let ip = cluster.host_ip(cluster.layout.taskmanagers[index]);
        let line = tm.process.lines_with("listening on", tm.process.started);
        assert!(line.first().is_some_and(|l| l.text.contains(&format!("data port {ip}:"))), "{:?}", line);
    }

    // Nothing the REST API shows names loopback, on the leader or through the standby.
    let vertex = cluster.get(&format!("/jobs/{job}")).and_then(|d| d["vertices"][0]["id"].as_str().map(str::to_string));
    let vertex = vertex.expect("the job has vertices");
    let tm_id = cluster.taskmanager(0).id();
    let paths = [
        "/overview".to_string(),
        "/config".to_string(),
        "/taskmanagers".to_string(),
        format!("/taskmanagers/{tm_id}"),
        "/jobmanager/config".to_string(),
        "/jobmanager/environment".to_string(),
        format!("/jobs/{job}"),
        format!("/jobs/{job}/vertices/{vertex}"),
        format!("/jobs/{job}/vertices/{vertex}/taskmanagers"),
        format!("/jobs/{job}/jobmanager/config"),
    ];
    for jobmanager in cluster.jobmanagers.iter().flatten() {
        for path in &paths {
            let url = format!("http://{}{path}", jobmanager.rest);
            let body = get_json(&url, Duration::from_secs(5)).unwrap_or_else(|| panic!("GET {url} failed"));
            let text = body.to_string();
            assert!(!text.contains("127.0.0.1") && !text.contains("localhost"), "GET {url} names loopback: {text}");
        }
    }
    let config = cluster.get("/jobmanager/config").expect("the leader's configuration");
    let shown: BTreeMap<String, String> = config
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["key"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect();
    assert_eq!(shown.get("rest.address"), Some(&leader_ip), "{config}");
    cluster.wait_finished(&job, STEP_MAX);
    assert_counts_exactly_once(&committed_lines(&out), USERS, 6000);
}

#[test]
fn a_taskmanager_cut_off_from_the_jobmanagers_but_not_its_peers_stops_its_subtasks_and_the_job_runs_elsewhere() {
    let _serial = serial();
    let mut cluster = cluster();
    let out = cluster.output("out");
    let events = 3000 * 20;
    let job = submit(&cluster, &counter(out.to_str().unwrap(), events, 3000));
    cluster.wait_running(&job, STEP_MAX);
    std::thread::sleep(Duration::from_secs(2));
    let victim = cluster.taskmanagers_running(&job, STEP_MAX)[0];
    let victim_host = cluster.layout.taskmanagers[victim];
    let victim_id = cluster.taskmanager(victim).id();
    let restarts = cluster.restarts(&job);
    // The attempt the cut-off TaskManager runs: the newest with output so far.
    let zombie_attempt = committed_parts(&out).keys().copied().max().expect("the job committed output");

    // Cut off from both JobManagers' hosts; etcd and the other TaskManagers stay reachable.
    let cut = Instant::now();
    for &jobmanager in &cluster.layout.jobmanagers {
        cluster.net.partition(victim_host, jobmanager);
    }
    let moved = running_without(&cluster, &job, &victim_id, cut, STEP_MAX);
    assert!(
        moved <= HEARTBEAT_TIMEOUT + Duration::from_secs(1),
        "the job ran elsewhere only {moved:?} after the cut (heartbeat.timeout {HEARTBEAT_TIMEOUT:?})"
    );
    assert!(cluster.restarts(&job) > restarts, "the job moved without a restart?");
    // No zombie: it cancels its subtasks itself, heartbeat.timeout after it last heard from
    // the JobManager (which heartbeats it every second).
    let cancelled =
        cluster.taskmanager_mut(victim).process.wait_line("cancelling this TaskManager's subtasks", cut, STEP_MAX);
    let after = cancelled.at - cut;
    assert!(
        after >= HEARTBEAT_TIMEOUT - HEARTBEAT_PERIOD - Duration::from_millis(300)
            && after <= HEARTBEAT_TIMEOUT + Duration::from_secs(1),
        "the cut-off TaskManager cancelled its subtasks {after:?} after the cut: {}",
        cancelled.text
    );
    eprintln!("cut off: the job RUNNING elsewhere after {moved:?}, the TaskManager cancelled after {after:?}");

    std::thread::sleep(Duration::from_secs(1));
    let healed = Instant::now();
    let before_heal = committed_parts(&out);
    cluster.net.heal_all();
    let back = cluster.taskmanager_mut(victim).process.wait_line("registered at", healed, STEP_MAX);
    eprintln!("healed: the TaskManager registered again after {:?}", back.at - healed);
    let listed = hosts::get_json(
        &format!("http://{}/taskmanagers", cluster.jobmanager(cluster.leader_index()).rest),
        Duration::from_secs(5),
    );
    let ids: Vec<String> = listed
        .map(|l| {
            l["taskmanagers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    assert!(ids.contains(&victim_id), "the healed TaskManager is not registered: {ids:?}");
    cluster.wait_finished(&job, Duration::from_secs(90));
    // What the zombie's attempt had committed by the heal (its own commits before the cut,
    // and what the restore of its successor committed of its staged parts) is all it ever
    // committed: back, it commits nothing (its stale attempt is cancelled, never adopted).
    let after_heal = committed_parts(&out);
    assert_eq!(
        after_heal.get(&zombie_attempt),
        before_heal.get(&zombie_attempt),
        "attempt {zombie_attempt} of the cut-off TaskManager committed more after the heal"
    );
    assert_counts_exactly_once(&committed_lines(&out), USERS, events);
    assert_one_leader_per_checkpoint(&cluster);
}

#[test]
fn the_leader_cut_off_from_etcd_but_not_from_the_taskmanagers_is_replaced_without_restarting_a_task() {
    let _serial = serial();
    let mut cluster = cluster();
    let out = cluster.output("out");
    let events = 3000 * 15;
    let job = submit(&cluster, &counter(out.to_str().unwrap(), events, 3000));
    cluster.wait_running(&job, STEP_MAX);
    std::thread::sleep(Duration::from_secs(2));
    let (old, old_epoch) = cluster.wait_for_leader(None, STEP_MAX);
    let old_jm = cluster.jobmanager(old);
    let (old_rest, old_rpc) = (old_jm.rest.clone(), old_jm.rpc.clone());
    let leads_before = old_jm.process.lines_with(" leads cluster ", old_jm.process.started).len();

    let cut = Instant::now();
    cluster.net.partition(cluster.layout.jobmanagers[old], cluster.layout.etcd);
    // The harness watches the leader key: it goes when etcd expires the old lease, and a
    // standby's key (a new epoch) follows.
    let mut expired = None;
    let (new_epoch, led_at) = loop {
        let now = Instant::now();
        match cluster.leader() {
            Some((_, epoch)) if epoch == old_epoch => {}
            Some((_, epoch)) => {
                expired.get_or_insert(now);
                break (epoch, now);
            }
            None => {
                expired.get_or_insert(now);
            }
        }
        assert!(now < cut + STEP_MAX, "no new leader within {STEP_MAX:?}\n{}", cluster.tails(30));
        std::thread::sleep(Duration::from_millis(5));
    };
    let expired = expired.unwrap_or(led_at);
    assert!(new_epoch > old_epoch);
    // It stopped acting before etcd could expire its lease and elect another.
    let lost = cluster.jobmanager_mut(old).process.wait_line("lost its leadership", cut, STEP_MAX);
    assert!(
        lost.at < expired,
        "the old leader stopped {:?} after the cut, its lease expired {:?} after it",
        lost.at - cut,
        expired - cut
    );
    cluster.wait_running(&job, STEP_MAX);
    let running = expired.elapsed();
    assert!(running <= Duration::from_secs(3), "RUNNING {running:?} after the old lease's expiry");
    eprintln!(
        "leader cut from etcd: it stopped after {:?}, its lease expired after {:?}, epoch {old_epoch} -> {new_epoch} after {:?}, RUNNING {running:?} after the expiry",
        lost.at - cut,
        expired - cut,
        led_at - cut
    );
    // Its commands are refused: it answers nothing as leader (and cannot forward: it does not
    // reach etcd to learn who leads), and no TaskManager registers with it again.
    let body = serde_json::json!({ "targetDirectory": cluster.output("savepoints").to_str(), "cancel-job": false })
        .to_string();
    let refused = post_json(&format!("http://{old_rest}/jobs/{job}/savepoints"), &body, Duration::from_secs(5));
    assert!(
        refused.as_ref().is_some_and(|(status, _)| *status == 503),
        "a savepoint through the old leader: {refused:?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    cluster.net.heal_all();
    // Healed, it stands by and answers as the new leader (forwarding), once its etcd client
    // is back (its reconnect backs off: allow some seconds).
    let healed = Instant::now();
    let forwarded = loop {
        let answer = get_json(&format!("http://{old_rest}/jobs/{job}"), Duration::from_secs(5));
        if answer.as_ref().is_some_and(|d| d["state"] == "RUNNING" || d["state"] == "FINISHED")
            || healed.elapsed() > Duration::from_secs(15)
        {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        forwarded.as_ref().is_some_and(|d| d["state"] == "RUNNING" || d["state"] == "FINISHED"),
        "the healed old leader forwards to the new one within 15 s: {forwarded:?}"
    );
    cluster.wait_finished(&job, Duration::from_secs(90));
    let old_jm = cluster.jobmanager(old);
    assert_eq!(old_jm.process.lines_with(" leads cluster ", old_jm.process.started).len(), leads_before);
    assert_eq!(registrations_at(&cluster, &old_rpc, led_at), 0, "a TaskManager registered with the old leader");
    assert!(
        cluster
            .taskmanagers
            .iter()
            .flatten()
            .all(|tm| tm.process.lines_with("cancelling this TaskManager's subtasks", cut).is_empty()),
        "a TaskManager cancelled its subtasks during the takeover"
    );
    assert_eq!(cluster.restarts(&job), 0, "{:?}", cluster.get(&format!("/jobs/{job}/exceptions")));
    assert_eq!(committed_parts(&out).keys().copied().collect::<Vec<_>>(), [0], "a task was restarted");
    assert_counts_exactly_once(&committed_lines(&out), USERS, events);
    let checkpoints = assert_one_leader_per_checkpoint(&cluster);
    assert!(checkpoints > 10);
}

#[test]
fn one_way_partitions_between_a_taskmanager_and_the_leader_stop_the_taskmanager_and_move_its_subtasks() {
    let _serial = serial();
    let mut cluster = cluster();
    let out = cluster.output("out");
    let events = 3000 * 30;
    let job = submit(&cluster, &counter(out.to_str().unwrap(), events, 3000));
    cluster.wait_running(&job, STEP_MAX);
    // First the TaskManager can send to the leader but hears nothing from it, then the
    // other way round. On a connection both ways are needed (TCP's acknowledgements), so
    // both look like a full partition to both sides within a retransmission timeout.
    for (round, hears_the_leader) in [false, true].into_iter().enumerate() {
        std::thread::sleep(Duration::from_secs(1));
        let leader = cluster.leader_index();
        let leader_host = cluster.layout.jobmanagers[leader];
        let victim = cluster.taskmanagers_running(&job, STEP_MAX)[0];
        let victim_host = cluster.layout.taskmanagers[victim];
        let victim_id = cluster.taskmanager(victim).id();
        let cut = Instant::now();
        if hears_the_leader {
            cluster.net.partition_one_way(victim_host, leader_host);
        } else {
            cluster.net.partition_one_way(leader_host, victim_host);
        }
        let moved = running_without(&cluster, &job, &victim_id, cut, STEP_MAX);
        let cancelled =
            cluster.taskmanager_mut(victim).process.wait_line("cancelling this TaskManager's subtasks", cut, STEP_MAX);
        eprintln!(
            "one-way {round} (the TaskManager {} the leader): RUNNING elsewhere after {moved:?}, the TaskManager cancelled after {:?}",
            if hears_the_leader { "hears but cannot reach" } else { "reaches but does not hear" },
            cancelled.at - cut
        );
        assert!(moved <= 2 * HEARTBEAT_TIMEOUT, "RUNNING elsewhere only after {moved:?}");
        let healed = Instant::now();
        cluster.net.heal(leader_host, victim_host);
        cluster.taskmanager_mut(victim).process.wait_line("registered at", healed, STEP_MAX);
    }
    cluster.wait_finished(&job, Duration::from_secs(90));
    assert_counts_exactly_once(&committed_lines(&out), USERS, events);
    assert_one_leader_per_checkpoint(&cluster);
}

/// Waits until the leader has `count` TaskManagers registered.
fn wait_taskmanagers(cluster: &HostCluster, count: usize) {
    let deadline = Instant::now() + STEP_MAX;
    while cluster.get("/taskmanagers").and_then(|l| l["taskmanagers"].as_array().map(Vec::len)) != Some(count) {
        assert!(Instant::now() < deadline, "not {count} TaskManagers registered\n{}", cluster.tails(20));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kill_9_and_sigstop_of_every_process_kind_keep_kafka_output_exactly_once() {
    let _serial = serial();
    let mut cluster = cluster();
    // The broker on etcd's host (an own host would be a seventh).
    let broker_ip = cluster.host_ip(cluster.layout.etcd).to_string();
    let broker = {
        let host = cluster.net.host(cluster.layout.etcd);
        kafka::Broker::start_with(&broker_ip, || 9092, |program| host.command(program))
    };
    broker.create_topic("counts", 2);
    let output = format!("kafka://{}/counts", broker.bootstrap);
    let events = 2000 * 45;
    let job = submit(&cluster, &counter(&output, events, 2000));
    cluster.wait_running(&job, STEP_MAX);
    let mut log = Vec::new();

    // A TaskManager killed: its connection drops, the job moves at once; a new one starts
    // on its host.
    let victim = cluster.taskmanagers_running(&job, STEP_MAX)[0];
    let victim_id = cluster.taskmanager(victim).id();
    let at = Instant::now();
    cluster.taskmanager_mut(victim).process.kill_hard();
    log.push(format!(
        "TaskManager kill -9: RUNNING elsewhere after {:?}",
        running_without(&cluster, &job, &victim_id, at, STEP_MAX)
    ));
    cluster.start_taskmanager(victim);
    wait_taskmanagers(&cluster, 3);

    // A TaskManager frozen past heartbeat.timeout: the job moves; woken, it cancels its
    // subtasks itself before it registers again.
    let victim = cluster.taskmanagers_running(&job, STEP_MAX)[0];
    let victim_id = cluster.taskmanager(victim).id();
    let at = Instant::now();
    cluster.taskmanager(victim).process.signal(libc::SIGSTOP);
    let moved = running_without(&cluster, &job, &victim_id, at, STEP_MAX);
    std::thread::sleep(Duration::from_millis(1500));
    let woken = Instant::now();
    cluster.taskmanager(victim).process.signal(libc::SIGCONT);
    let tm = &mut cluster.taskmanager_mut(victim).process;
    let cancelled = tm.wait_line("cancelling this TaskManager's subtasks", woken, STEP_MAX);
    let registered = tm.wait_line("registered at", woken, STEP_MAX);
    assert!(cancelled.at <= registered.at, "the woken TaskManager registered before it cancelled its subtasks");
    log.push(format!(
        "TaskManager SIGSTOP: RUNNING elsewhere after {moved:?}; woken after {:?}, it cancelled, then registered",
        woken - at
    ));

    // The standby killed and frozen: nothing happens to the job.
    let restarts = cluster.restarts(&job);
    let (leader, epoch) = cluster.wait_for_leader(None, STEP_MAX);
    let standby = 1 - leader;
    cluster.jobmanager_mut(standby).process.kill_hard();
    std::thread::sleep(Duration::from_secs(1));
    cluster.start_jobmanager(standby);
    cluster.jobmanager(standby).process.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    cluster.jobmanager(standby).process.signal(libc::SIGCONT);
    assert_eq!(cluster.wait_for_leader(None, STEP_MAX).1, epoch, "the leader changed when the standby died or froze");
    assert_eq!(cluster.restarts(&job), restarts);
    log.push("standby kill -9 and SIGSTOP: no change".to_string());

    // The leader killed: the standby takes over without restarting a task (a new leader's
    // restart count starts at 0 with the job it takes over).
    let at = Instant::now();
    cluster.jobmanager_mut(leader).process.kill_hard();
    let (_, next_epoch) = cluster.wait_for_leader(Some(epoch), STEP_MAX);
    cluster.wait_running(&job, STEP_MAX);
    assert_eq!(
        cluster.restarts(&job),
        0,
        "the takeover after a leader's kill restarted tasks: {:?}",
        cluster.get(&format!("/jobs/{job}/exceptions"))
    );
    log.push(format!("leader kill -9: epoch {epoch} -> {next_epoch}, RUNNING after {:?}", at.elapsed()));
    cluster.start_jobmanager(leader);

    // The leader frozen past its lease: the standby takes over; woken, the old one finds
    // its leadership gone, stands by, and no TaskManager goes back to it.
    let (leader, epoch) = cluster.wait_for_leader(None, STEP_MAX);
    let at = Instant::now();
    cluster.jobmanager(leader).process.signal(libc::SIGSTOP);
    let (_, next_epoch) = cluster.wait_for_leader(Some(epoch), STEP_MAX);
    let led_at = Instant::now();
    cluster.wait_running(&job, STEP_MAX);
    log.push(format!("leader SIGSTOP: epoch {epoch} -> {next_epoch}, RUNNING after {:?}", at.elapsed()));
    std::thread::sleep(Duration::from_secs(1));
    let woken = Instant::now();
    cluster.jobmanager(leader).process.signal(libc::SIGCONT);
    cluster.jobmanager_mut(leader).process.wait_line("lost its leadership", woken, STEP_MAX);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(registrations_at(&cluster, &cluster.jobmanager(leader).rpc, led_at), 0);
    assert_eq!(
        cluster.restarts(&job),
        0,
        "the takeover after a leader's freeze restarted tasks: {:?}",
        cluster.get(&format!("/jobs/{job}/exceptions"))
    );

    // etcd killed (and back after a second) and frozen: a leader again, the job RUNNING.
    let at = Instant::now();
    cluster.etcd.kill_hard();
    std::thread::sleep(Duration::from_secs(1));
    cluster.etcd.restart(&cluster.net);
    cluster.wait_for_leader(None, STEP_MAX);
    cluster.wait_running(&job, STEP_MAX);
    log.push(format!("etcd kill -9 (down 1 s): RUNNING under a leader after {:?}", at.elapsed()));
    let at = Instant::now();
    cluster.etcd.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    cluster.etcd.signal(libc::SIGCONT);
    cluster.wait_for_leader(None, STEP_MAX);
    cluster.wait_running(&job, STEP_MAX);
    log.push(format!("etcd SIGSTOP (3 s): RUNNING under a leader after {:?}", at.elapsed()));

    cluster.wait_finished(&job, Duration::from_secs(120));
    let counts = broker.read_committed("counts", events as usize, Duration::from_secs(30));
    if counts.len() != events as usize {
        let all = broker.read("counts", events as usize, Duration::from_secs(5), "read_uncommitted");
        eprintln!(
            "read_committed: {} of {events} counts; read_uncommitted: {}; partitions (low, high): {:?}",
            counts.len(),
            all.len(),
            broker.watermarks("counts", 2)
        );
    }
    eprintln!("{}", log.join("\n"));
    assert_counts_exactly_once(&counts, USERS, events);
    assert_one_leader_per_checkpoint(&cluster);
}

/// splitmix64: the random schedule's generator, replayable from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }

    fn millis(&mut self, min: u64, max: u64) -> Duration {
        Duration::from_millis(min + self.next() % (max - min + 1))
    }
}

/// A process of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Process {
    Etcd,
    JobManager(usize),
    TaskManager(usize),
}

/// A fault of the random schedule; each is undone by its heal.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Partition(usize, usize),
    /// Packets from the first host to the second are dropped.
    OneWay(usize, usize),
    Isolate(usize),
    /// Loss in percent on everything the host sends and receives.
    Loss(usize, u32),
    /// `kill -9`; the heal starts it again (as a supervisor would).
    Kill(Process),
    /// SIGSTOP; the heal is SIGCONT.
    Freeze(Process),
}

fn host_of(cluster: &HostCluster, process: Process) -> usize {
    match process {
        Process::Etcd => cluster.layout.etcd,
        Process::JobManager(i) => cluster.layout.jobmanagers[i],
        Process::TaskManager(i) => cluster.layout.taskmanagers[i],
    }
}

impl Fault {
    /// The hosts it involves: no other fault touches them while it lasts.
    fn hosts(&self, cluster: &HostCluster) -> Vec<usize> {
        match *self {
            Fault::Partition(a, b) | Fault::OneWay(a, b) => vec![a, b],
            Fault::Isolate(a) | Fault::Loss(a, _) => vec![a],
            Fault::Kill(process) | Fault::Freeze(process) => vec![host_of(cluster, process)],
        }
    }

    fn inject(&self, cluster: &mut HostCluster) {
        match *self {
            Fault::Partition(a, b) => cluster.net.partition(a, b),
            Fault::OneWay(from, to) => cluster.net.partition_one_way(from, to),
            Fault::Isolate(a) => cluster.net.isolate(a),
            Fault::Loss(a, percent) => cluster.net.loss(a, f64::from(percent) / 100.0),
            Fault::Kill(Process::Etcd) => cluster.etcd.kill_hard(),
            Fault::Kill(Process::JobManager(i)) => cluster.jobmanager_mut(i).process.kill_hard(),
            Fault::Kill(Process::TaskManager(i)) => cluster.taskmanager_mut(i).process.kill_hard(),
            Fault::Freeze(process) => signal(cluster, process, libc::SIGSTOP),
        }
    }

    fn heal(&self, cluster: &mut HostCluster) {
        match *self {
            Fault::Partition(a, b) | Fault::OneWay(a, b) => cluster.net.heal(a, b),
            Fault::Isolate(a) => cluster.net.rejoin(a),
            Fault::Loss(a, _) => cluster.net.clear_loss(a),
            Fault::Kill(Process::Etcd) => cluster.etcd.respawn(&cluster.net),
            Fault::Kill(Process::JobManager(i)) => cluster.spawn_jobmanager(i),
            Fault::Kill(Process::TaskManager(i)) => cluster.spawn_taskmanager_with(i, &[]),
            Fault::Freeze(process) => signal(cluster, process, libc::SIGCONT),
        }
    }
}

fn signal(cluster: &HostCluster, process: Process, signal: i32) {
    match process {
        Process::Etcd => cluster.etcd.signal(signal),
        Process::JobManager(i) => cluster.jobmanager(i).process.signal(signal),
        Process::TaskManager(i) => cluster.taskmanager(i).process.signal(signal),
    }
}

/// Starts again whatever exited by itself, as a supervisor (systemd, Kubernetes) would: a
/// process started while etcd is out of reach exits at once, naming it. `down` are killed
/// on purpose and wait for their heal.
fn supervise(cluster: &mut HostCluster, down: &[Process]) -> usize {
    let mut restarted = 0;
    if !down.contains(&Process::Etcd) && cluster.etcd.exited() {
        cluster.etcd.respawn(&cluster.net);
        restarted += 1;
    }
    for i in 0..cluster.jobmanagers.len() {
        if !down.contains(&Process::JobManager(i)) && cluster.jobmanager_mut(i).process.exited() {
            cluster.spawn_jobmanager(i);
            restarted += 1;
        }
    }
    for i in 0..cluster.taskmanagers.len() {
        if !down.contains(&Process::TaskManager(i)) && cluster.taskmanager_mut(i).process.exited() {
            cluster.spawn_taskmanager_with(i, &[]);
            restarted += 1;
        }
    }
    restarted
}

/// Prints the seed and the schedule so far when the test fails.
struct Replay {
    seed: u64,
    log: Vec<String>,
}

impl Drop for Replay {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the schedule so far:\n{}", self.log.join("\n"));
            eprintln!("replay this run with WEIR_MULTI_HOST_SEED={}", self.seed);
        }
    }
}

/// Faults of the random schedule, at least.
const RANDOM_FAULTS: usize = 50;
/// Faults in force at once, at most.
const RANDOM_CONCURRENT_MAX: usize = 2;

#[test]
fn a_random_schedule_of_partitions_loss_kills_and_freezes_keeps_the_output_exactly_once() {
    let _serial = serial();
    let seed: u64 =
        std::env::var("WEIR_MULTI_HOST_SEED").ok().and_then(|s| s.trim().parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
        });
    eprintln!("WEIR_MULTI_HOST_SEED={seed}");
    let mut replay = Replay { seed, log: Vec::new() };
    let mut rng = Rng(seed);
    let mut cluster = cluster();
    let out = cluster.output("out");
    // About as long as the schedule without faults; the faults' downtime adds to it.
    let (rate, events) = (3000, 3000 * 40);
    let job = submit(&cluster, &counter(out.to_str().unwrap(), events, rate));
    cluster.wait_running(&job, STEP_MAX);

    let hosts = cluster.layout.hosts();
    let processes: Vec<Process> = std::iter::once(Process::Etcd)
        .chain((0..cluster.jobmanagers.len()).map(Process::JobManager))
        .chain((0..cluster.taskmanagers.len()).map(Process::TaskManager))
        .collect();
    let start = Instant::now();
    let mut active: Vec<(Fault, Instant)> = Vec::new();
    let (mut injected, mut while_running, mut supervised) = (0, 0, 0);
    let mut next_at = start;
    while injected < RANDOM_FAULTS || !active.is_empty() {
        let now = Instant::now();
        let (due, lasting): (Vec<_>, Vec<_>) = active.into_iter().partition(|(_, until)| *until <= now);
        active = lasting;
        for (fault, _) in due {
            replay.log.push(format!("{:>6.1}s heal {fault:?}", start.elapsed().as_secs_f64()));
            fault.heal(&mut cluster);
        }
        let down: Vec<Process> =
            active.iter().filter_map(|(fault, _)| if let Fault::Kill(p) = fault { Some(*p) } else { None }).collect();
        supervised += supervise(&mut cluster, &down);
        if injected < RANDOM_FAULTS && now >= next_at && active.len() < RANDOM_CONCURRENT_MAX {
            let busy: Vec<usize> = active.iter().flat_map(|(fault, _)| fault.hosts(&cluster)).collect();
            let free: Vec<usize> = (0..hosts).filter(|host| !busy.contains(host)).collect();
            let free_processes: Vec<Process> =
                processes.iter().copied().filter(|&p| free.contains(&host_of(&cluster, p))).collect();
            let fault = match rng.below(6) {
                0 | 1 if free.len() >= 2 => {
                    let a = rng.pick(&free);
                    let others: Vec<usize> = free.iter().copied().filter(|&h| h != a).collect();
                    let b = rng.pick(&others);
                    if rng.below(2) == 0 { Fault::Partition(a, b) } else { Fault::OneWay(a, b) }
                }
                2 if !free.is_empty() => Fault::Isolate(rng.pick(&free)),
                3 if !free.is_empty() => Fault::Loss(rng.pick(&free), 5 + rng.below(26) as u32),
                4 if !free_processes.is_empty() => Fault::Kill(rng.pick(&free_processes)),
                5 if !free_processes.is_empty() => Fault::Freeze(rng.pick(&free_processes)),
                _ => {
                    next_at = now + Duration::from_millis(100);
                    continue;
                }
            };
            // Some TaskManager freezes outlast heartbeat.timeout (the job moves, the woken
            // one must stop as a zombie); leaders' freezes may outlast the lease.
            let lasts = match fault {
                Fault::Kill(_) => rng.millis(100, 2000),
                Fault::Freeze(Process::TaskManager(_)) => rng.millis(200, 6500),
                Fault::Freeze(_) => rng.millis(200, 4000),
                Fault::Loss(..) => rng.millis(1000, 5000),
                _ => rng.millis(300, 4000),
            };
            let state = cluster.job_status(&job).map(|(state, _)| state);
            if state.as_deref() != Some("FINISHED") {
                while_running += 1;
            }
            replay.log.push(format!(
                "{:>6.1}s fault {injected}: {fault:?} for {lasts:?} (job {state:?})",
                start.elapsed().as_secs_f64()
            ));
            fault.inject(&mut cluster);
            active.push((fault, Instant::now() + lasts));
            injected += 1;
            next_at = Instant::now() + rng.millis(100, 1200);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let schedule = start.elapsed();
    cluster.net.clear_faults();
    // Healed: the job finishes without anyone acting (the supervisor only restarts what
    // exited, as systemd or Kubernetes would).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        supervised += supervise(&mut cluster, &[]);
        if cluster.job_status(&job).is_some_and(|(state, _)| state == "FINISHED") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the job did not finish within 120 s of the heal: {:?}\n{}",
            cluster.job_status(&job),
            cluster.tails(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let checkpoints = assert_one_leader_per_checkpoint(&cluster);
    let attempts = committed_parts(&out).len();
    eprintln!(
        "{injected} faults ({while_running} while the job ran) in {schedule:?}; FINISHED {:?} after the last heal; {checkpoints} checkpoints, {attempts} attempts with output, {supervised} processes restarted after exiting",
        start.elapsed() - schedule
    );
    assert!(injected >= RANDOM_FAULTS);
    assert_counts_exactly_once(&committed_lines(&out), USERS, events);
}

// Measurements for BENCHMARKS.md ("Across machines (issue 26)"): `bench/multi-host.sh` runs
// them on a release build, `WEIR_BENCH_ROUNDS` rounds each (default 5). They print; they
// assert only that what they measure happened.

fn bench_rounds() -> usize {
    std::env::var("WEIR_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5)
}

/// min, median and max of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (sorted[0], sorted[sorted.len() / 2], sorted[sorted.len() - 1])
}

fn report(what: &str, unit: &str, values: &[f64]) {
    let (min, median, max) = spread(values);
    let all: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
    eprintln!("BENCH {what}: median {median:.3} {unit} (min {min:.3}, max {max:.3}; runs: {})", all.join(", "));
}

/// Runs the counter at p=4 to its end `rounds` times; its throughput in events per second
/// from the job's own duration (submit to FINISHED, deploy included).
fn counter_throughput(cluster: &HostCluster, events: u64, rounds: usize) -> Vec<f64> {
    (0..rounds)
        .map(|_| {
            let args = ["-p", "4", "counter", "--users", "100000", "--events", &events.to_string(), "--output", "none"];
            let job = cluster.submit(&args);
            cluster.wait_finished(&job, Duration::from_secs(300));
            let details = cluster.get(&format!("/jobs/{job}")).expect("the finished job's details");
            let ms = details["duration"].as_u64().expect("a duration");
            events as f64 / (ms as f64 / 1000.0)
        })
        .collect()
}

/// A JobManager and two TaskManagers (2 slots each) on hosts 1 to 3; with `delay`, each
/// TaskManager's data port is reached through a delay proxy in the harness (`delay` each
/// way: the round trip between the TaskManagers is `2 * delay` longer).
fn two_taskmanager_hosts(delay: Option<Duration>) -> (HostCluster, Vec<netns::TcpDelayProxy>) {
    let mut cluster =
        HostCluster::start_without_taskmanagers(Layout::spread(1, 2, 0), &["execution.checkpointing.interval: none"]);
    let mut proxies = Vec::new();
    for index in 0..2 {
        let host = cluster.layout.taskmanagers[index];
        let overrides = match delay {
            None => Vec::new(),
            Some(delay) => {
                // The TaskManager listens on its own address and advertises the harness's,
                // where the proxy listens on the same port and relays to it.
                let port = hosts::DATA_PORT + index as u16;
                let proxy =
                    cluster.net.delay_proxy(host, port, delay, Duration::ZERO).expect("the delay proxy listens");
                proxies.push(proxy);
                vec![
                    format!("taskmanager.host={}", cluster.net.harness_ip()),
                    format!("taskmanager.bind-host={}", cluster.host_ip(host)),
                    format!("taskmanager.data.port={port}"),
                ]
            }
        };
        cluster.start_taskmanager_with(index, &overrides);
    }
    (cluster, proxies)
}

#[test]
#[ignore = "a measurement for BENCHMARKS.md: bench/multi-host.sh"]
fn bench_counter_p4_across_two_taskmanager_hosts_with_1ms_rtt_against_loopback() {
    let _serial = serial();
    let rounds = bench_rounds();
    let events: u64 = std::env::var("WEIR_BENCH_EVENTS").ok().and_then(|e| e.parse().ok()).unwrap_or(100_000_000);
    let mut medians = Vec::new();
    let configurations: [(&str, Option<Option<Duration>>); 4] = [
        ("loopback cluster (JobManager and 2 TaskManagers on one host, 127.0.0.1)", None),
        ("2 TaskManager hosts, direct", Some(None)),
        ("2 TaskManager hosts through the delay proxy, 0 ms", Some(Some(Duration::ZERO))),
        (
            "2 TaskManager hosts through the delay proxy, 0.5 ms each way (1 ms RTT)",
            Some(Some(Duration::from_micros(500))),
        ),
    ];
    for (name, setup) in configurations {
        let (cluster, proxies) = match setup {
            None => (HostCluster::start_loopback(2, &["execution.checkpointing.interval: none"]), Vec::new()),
            Some(delay) => two_taskmanager_hosts(delay),
        };
        let throughput: Vec<f64> = counter_throughput(&cluster, events, rounds).into_iter().map(|e| e / 1e6).collect();
        report(&format!("counter p=4, {events} events, {name}"), "M events/s", &throughput);
        // The data plane went through the proxies: each relayed the other TaskManager's
        // connections to its TaskManager.
        for proxy in &proxies {
            assert!(proxy.connections() > 0, "nothing went through the delay proxy to {}", proxy.target());
        }
        medians.push(spread(&throughput).1);
        drop(proxies);
        drop(cluster);
    }
    eprintln!("BENCH 1 ms RTT against loopback: {:.0} % (medians)", 100.0 * medians[3] / medians[0]);
}

#[test]
#[ignore = "a measurement for BENCHMARKS.md: bench/multi-host.sh"]
fn bench_a_taskmanager_partitioned_away_until_the_job_runs_again() {
    let _serial = serial();
    let mut cluster = cluster();
    let job = cluster.submit(&["-p", "2", "counter", "--users", "1000", "--rate", "5000", "--output", "none"]);
    cluster.wait_running(&job, STEP_MAX);
    let mut took = Vec::new();
    for _ in 0..bench_rounds() {
        std::thread::sleep(Duration::from_secs(2));
        let victim = cluster.taskmanagers_running(&job, STEP_MAX)[0];
        let host = cluster.layout.taskmanagers[victim];
        let id = cluster.taskmanager(victim).id();
        let cut = Instant::now();
        for &jobmanager in &cluster.layout.jobmanagers {
            cluster.net.partition(host, jobmanager);
        }
        took.push(running_without(&cluster, &job, &id, cut, STEP_MAX).as_secs_f64());
        let healed = Instant::now();
        cluster.net.heal_all();
        cluster.taskmanager_mut(victim).process.wait_line("registered at", healed, STEP_MAX);
    }
    report(
        "a TaskManager partitioned from the JobManagers until the job is RUNNING elsewhere (heartbeat.timeout 5 s)",
        "s",
        &took,
    );
}

#[test]
#[ignore = "a measurement for BENCHMARKS.md: bench/multi-host.sh"]
fn bench_the_leader_partitioned_from_etcd_until_a_standby_runs_the_job() {
    let _serial = serial();
    let cluster = cluster();
    let job = cluster.submit(&["-p", "2", "counter", "--users", "1000", "--rate", "5000", "--output", "none"]);
    cluster.wait_running(&job, STEP_MAX);
    let (mut after_expiry, mut after_cut, mut leading) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..bench_rounds() {
        std::thread::sleep(Duration::from_secs(2));
        let (old, epoch) = cluster.wait_for_leader(None, STEP_MAX);
        let old_host = cluster.layout.jobmanagers[old];
        let cut = Instant::now();
        cluster.net.partition(old_host, cluster.layout.etcd);
        let mut expired = None;
        let led = loop {
            let now = Instant::now();
            match cluster.leader() {
                Some((_, e)) if e == epoch => {}
                Some(_) => {
                    expired.get_or_insert(now);
                    break now;
                }
                None => {
                    expired.get_or_insert(now);
                }
            }
            assert!(now < cut + STEP_MAX, "no new leader");
            std::thread::sleep(Duration::from_millis(2));
        };
        let expired = expired.unwrap_or(led);
        cluster.wait_running(&job, STEP_MAX);
        after_expiry.push(expired.elapsed().as_secs_f64());
        after_cut.push(cut.elapsed().as_secs_f64());
        leading.push((led - expired).as_secs_f64());
        let restarts = cluster.restarts(&job);
        assert_eq!(restarts, 0, "round {round}: the takeover restarted tasks");
        cluster.net.heal_all();
        std::thread::sleep(Duration::from_secs(1));
    }
    report("the leader cut from etcd: the old lease's expiry until a standby leads", "s", &leading);
    report(
        "the leader cut from etcd: the old lease's expiry until the job is RUNNING (no task restarted)",
        "s",
        &after_expiry,
    );
    report("the leader cut from etcd: the cut until the job is RUNNING", "s", &after_cut);
}

#[test]
#[ignore = "a measurement for BENCHMARKS.md: bench/multi-host.sh"]
fn bench_sigterm_of_the_leader_until_a_standby_leads() {
    let _serial = serial();
    let mut cluster = cluster();
    let job = cluster.submit(&["-p", "2", "counter", "--users", "1000", "--rate", "5000", "--output", "none"]);
    cluster.wait_running(&job, STEP_MAX);
    let (mut leading, mut running) = (Vec::new(), Vec::new());
    for _ in 0..bench_rounds() {
        std::thread::sleep(Duration::from_secs(2));
        let (old, epoch) = cluster.wait_for_leader(None, STEP_MAX);
        let at = Instant::now();
        cluster.jobmanager(old).process.signal(libc::SIGTERM);
        loop {
            if cluster.leader().is_some_and(|(_, e)| e != epoch) {
                break;
            }
            assert!(at.elapsed() < STEP_MAX, "no new leader");
            std::thread::sleep(Duration::from_millis(1));
        }
        leading.push(at.elapsed().as_secs_f64());
        cluster.wait_running(&job, STEP_MAX);
        running.push(at.elapsed().as_secs_f64());
        assert_eq!(cluster.jobmanager_mut(old).process.wait_exit(STEP_MAX), Some(0));
        cluster.start_jobmanager(old);
    }
    report("SIGTERM of the leader until a standby leads (etcd names it)", "s", &leading);
    report("SIGTERM of the leader until the job is RUNNING under the standby", "s", &running);
}
