//! A deterministic simulation of the control plane (issue 28): the real checkpoint state
//! machine ([`crate::checkpointing::book`]) and its real driver, in a simulated cluster
//! ([`cluster`]) of two JobManagers, an HA store, object storage, a network and transactional
//! sinks, all driven by one seeded scheduler that also injects faults and crashes at every
//! effect boundary. After every step the invariants are checked; a failure prints the seed, a
//! readable trace, and the command that replays it:
//!
//! ```text
//! WEIR_SIM_SEED=<seed> cargo test -p weir-runtime --lib simulation::tests::replay -- --ignored --nocapture
//! ```
//!
//! See docs/simulation.md.

mod cluster;
mod io;
mod slots;
mod takeover;
mod tasks;
mod world;

use cluster::{Body, Cluster, Destination, JobManager, draw_flake};

/// What one seed's run came to.
pub struct Report {
    pub seed: u64,
    pub steps: usize,
    pub finished: bool,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub checkpoints: u64,
    /// Jobs whose restart strategy gave up (each resubmitted by the user).
    pub failed_jobs: u64,
}

/// Runs the cluster of `seed` to its end: the job finished, or a violation.
pub fn run(seed: u64) -> Report {
    let mut cluster = Cluster::new(seed);
    while cluster.step < cluster.shape.max_steps && cluster.violations.is_empty() && !cluster.ha.finished {
        cluster.step += 1;
        housekeeping(&mut cluster);
        step(&mut cluster);
        check(&mut cluster);
    }
    if cluster.violations.is_empty() {
        finish_check(&mut cluster);
    }
    Report {
        seed,
        steps: cluster.step,
        finished: cluster.ha.finished,
        checkpoints: cluster.highest_id,
        failed_jobs: cluster.failed_jobs,
        violations: cluster.violations,
        trace: cluster.trace,
    }
}

/// Processes that wake or come back, and an election once the leader's lease ran out.
fn housekeeping(cluster: &mut Cluster) {
    let now = cluster.now_ms;
    for jm in 0..cluster.jms.len() {
        match &mut cluster.jms[jm] {
            JobManager::Frozen { until, master } if *until <= now => {
                cluster.trace.push(format!("JM{jm} wakes"));
                cluster.jms[jm] = match master.take() {
                    Some(master) => JobManager::Leading(master),
                    None => JobManager::Standby,
                };
            }
            JobManager::Dead { restart_at } if *restart_at <= now => {
                cluster.trace.push(format!("JM{jm} restarted, standing by"));
                cluster.jms[jm] = JobManager::Standby;
            }
            _ => {}
        }
    }
    cluster.zombies.retain(|zombie| zombie.stops_at > now);
    cluster.ha.now_ms = now;
    // The kernel writes dirty directories back every few seconds.
    if now >= cluster.written_back_at + 5_000 {
        cluster.written_back_at = now;
        cluster.storage.write_back();
    }
    if let Some((subtask, attempt, at)) = cluster.loss_noticed
        && at <= now
    {
        cluster.loss_noticed = None;
        let current = cluster.tasks.first().map(|task| task.attempt) == Some(attempt);
        if let (true, Some(jm)) = (current, leader(cluster)) {
            cluster.trace.push(format!("JM{jm}: subtask {subtask}'s TaskManager silent for heartbeat.timeout"));
            cluster.taskmanager_lost(jm, subtask);
            cluster.fail_over(jm, "a TaskManager was lost (heartbeat.timeout)");
        }
    }
    if let Some(jm) = leader(cluster) {
        cluster.reconnect_taskmanagers(jm);
    }
    if cluster.ha.lease_until < now && !cluster.ha.finished {
        let standby = (0..cluster.jms.len()).find(|jm| matches!(cluster.jms[*jm], JobManager::Standby));
        if let Some(jm) = standby {
            cluster.take_over(jm);
        }
    }
}

/// One step the scheduler picks.
fn step(cluster: &mut Cluster) {
    match cluster.rng.below(100) {
        0..35 => {
            if !deliver(cluster) {
                cluster.now_ms += 1 + cluster.rng.below(20);
            }
        }
        35..60 => {
            let subtask = cluster.rng.below(cluster.shape.subtasks as u64) as usize;
            let records = cluster.shape.records;
            if let Some(task) = cluster.tasks.get_mut(subtask) {
                task.work(&mut cluster.rng, records);
            }
        }
        60..75 => cluster.now_ms += 1 + cluster.rng.below(40),
        75..90 => {
            for jm in 0..cluster.jms.len() {
                tick(cluster, jm);
            }
        }
        90..93 if cluster.savepoint_seq < 4 => {
            if let Some(jm) = leader(cluster) {
                // While faults last, a user may also stop the job with a savepoint and
                // submit it again from there.
                let terminate = cluster.faulting() && cluster.rng.one_in(2);
                cluster.user_savepoint(jm, terminate);
            }
        }
        _ => cluster.now_ms += 1,
    }
    if cluster.faulting() && cluster.rng.one_in(cluster.shape.fault_one_in) {
        fault(cluster);
    }
}

/// The JobManager leading the current epoch, when it is running.
fn leader(cluster: &Cluster) -> Option<usize> {
    let jm = cluster.ha.leader?;
    match &cluster.jms[jm] {
        JobManager::Leading(master) if master.epoch == cluster.ha.epoch => Some(jm),
        _ => None,
    }
}

/// A leading JobManager's timer: renew the lease (or learn it is lost), expire, trigger.
fn tick(cluster: &mut Cluster, jm: usize) {
    let JobManager::Leading(master) = &cluster.jms[jm] else { return };
    if master.epoch != cluster.ha.epoch {
        return cluster.step_down(jm);
    }
    cluster.ha.lease_until = cluster.now_ms + 300;
    cluster.drive(jm, crate::checkpointing::book::BookEvent::Tick);
    let JobManager::Leading(master) = &cluster.jms[jm] else { return };
    let follows = cluster.tasks.iter().all(|task| task.epoch == master.epoch);
    if cluster.ha.stopped_with.is_some() {
        // Stopped with a savepoint: whatever runs of it is cancelled, the user resubmits.
        return cluster.resubmit(jm);
    }
    if cluster.ha.failed.is_some() {
        // FAILED: the user resubmits it from its newest completed checkpoint.
        return cluster.resubmit_failed(jm);
    }
    if master.reconciling_until.is_some() {
        return cluster.reconcile(jm);
    }
    if master.slots.waiting.is_some() {
        // A new attempt waits for its slots: nothing runs to checkpoint or finish.
        return cluster.start_waiting_attempt(jm);
    }
    if cluster.tasks.iter().all(|task| task.finished) {
        return cluster.end_finished(jm);
    }
    let all_ended = cluster.tasks.iter().all(|task| task.ended);
    let now = cluster.now().at;
    if follows && all_ended && master.final_checkpoint.is_none() && master.book.periodic_slot_free() {
        cluster.trigger(jm, true);
    } else if follows && !all_ended && master.book.periodic_due(now) {
        cluster.trigger(jm, false);
    }
}

/// Delivers one message whose time has come, the first of its connection; false if none.
fn deliver(cluster: &mut Cluster) -> bool {
    let now = cluster.now_ms;
    let mut heads: Vec<usize> = Vec::new();
    for (index, message) in cluster.net.iter().enumerate() {
        let first_of_channel = !cluster.net[..index].iter().any(|m| m.channel == message.channel);
        let frozen =
            matches!(message.to, Destination::JobManager(jm) if matches!(cluster.jms[jm], JobManager::Frozen { .. }));
        if first_of_channel && message.deliver_at <= now && !frozen && !cluster.is_cut(message.channel) {
            heads.push(index);
        }
    }
    if heads.is_empty() {
        return false;
    }
    let pick = heads[cluster.rng.below(heads.len() as u64) as usize];
    let message = cluster.net.remove(pick);
    match message.to {
        Destination::Task(subtask) => to_task(cluster, subtask, message.attempt, message.epoch, message.body),
        Destination::JobManager(jm) => {
            let current = cluster.current_attempt() == Some(message.attempt);
            let accepts = matches!(&cluster.jms[jm], JobManager::Leading(master) if master.epoch == message.epoch);
            if let (true, true, Body::Ack(ack)) = (accepts, current, message.body) {
                cluster.drive(jm, crate::checkpointing::book::BookEvent::Ack(*ack));
            }
        }
    }
    true
}

fn to_task(cluster: &mut Cluster, subtask: u32, attempt: u64, epoch: u64, body: Body) {
    let incremental = cluster.shape.incremental;
    if cluster.tasks.get(subtask as usize).is_none_or(|task| task.attempt != attempt) {
        return to_zombie(cluster, subtask, attempt, epoch, body);
    }
    let Some(task) = cluster.tasks.get_mut(subtask as usize) else { return };
    // A finished subtask still answers barriers, with its final state (Flink's checkpoints
    // after tasks finished).
    if task.epoch != epoch {
        return;
    }
    match body {
        Body::Barrier(barrier) => {
            // An ended checkpoint's late snapshot is not written (the writer's rule); the
            // barrier says where the snapshot goes. A subtask stopping at a savepoint takes no
            // further snapshots (the source's rule).
            if task.ended_checkpoints.contains(&barrier.checkpoint_id) || task.stopping.is_some() {
                return;
            }
            let ack = task.snapshot(&barrier, &barrier.location, incremental, &mut cluster.rng, &mut cluster.storage);
            let (leader, attempt) = (task.leader, task.attempt);
            let destination = Destination::JobManager(leader);
            cluster.send(subtask as usize, 1000 + leader, epoch, attempt, destination, Body::Ack(Box::new(ack)));
        }
        Body::Complete { id } => {
            if let Err(error) = task.complete(id, &mut cluster.external) {
                cluster.violation(error);
            }
        }
        Body::Finish => task.finish(),
        Body::Aborted(id) => task.aborted(id),
        Body::Ack(_) | Body::Cancel => {}
    }
}

/// A message in flight to a replaced attempt's subtask, if it has not stopped: a completion
/// commits, a cancel stops it. It snapshots nothing more (its checkpoints were aborted with
/// the restart, and its acknowledgements would be refused as an old attempt's).
fn to_zombie(cluster: &mut Cluster, subtask: u32, attempt: u64, epoch: u64, body: Body) {
    let Some(at) = cluster.zombies.iter().position(|z| z.task.subtask == subtask && z.task.attempt == attempt) else {
        return;
    };
    let task = &mut cluster.zombies[at].task;
    // A TaskManager registered with a newer leader takes that leader's cancels.
    if task.epoch != epoch && !(matches!(body, Body::Cancel) && epoch > task.epoch) {
        return;
    }
    match body {
        Body::Complete { id } => {
            cluster.trace.push(format!("  replaced attempt {attempt}'s subtask {subtask} hears {id} completed"));
            if let Err(error) = task.complete(id, &mut cluster.external) {
                cluster.violation(error);
            }
        }
        Body::Aborted(id) => task.aborted(id),
        Body::Cancel => {
            cluster.zombies.remove(at);
        }
        Body::Barrier(_) | Body::Finish | Body::Ack(_) => {}
    }
}

/// One fault: a subtask fails, the leader is killed or frozen, the HA store flakes, or a
/// JobManager dies (standbys too).
fn fault(cluster: &mut Cluster) {
    let Some(jm) = leader(cluster) else { return };
    match cluster.rng.below(7) {
        0 => cluster.fail_over(jm, "a subtask failed"),
        5 => {
            let subtask = cluster.rng.below(cluster.shape.subtasks as u64) as u32;
            cluster.drop_connection(jm, subtask);
        }
        6 => {
            let subtask = cluster.rng.below(cluster.shape.subtasks as u64) as u32;
            let ms = 50 + cluster.rng.below(900);
            cluster.partition(subtask, ms);
        }
        1 => {
            cluster.trace.push(format!("fault: JM{jm} killed"));
            cluster.kill(jm);
        }
        2 => {
            let until = cluster.now_ms + 100 + cluster.rng.below(1100);
            cluster.trace.push(format!("fault: JM{jm} frozen until {until} ms"));
            let JobManager::Leading(master) = std::mem::replace(&mut cluster.jms[jm], JobManager::Standby) else {
                return;
            };
            cluster.jms[jm] = JobManager::Frozen { until, master: Some(master) };
        }
        3 if cluster.ha_outages => {
            let until = cluster.now_ms + 300 + cluster.rng.below(1200);
            cluster.trace.push(format!("fault: an HA outage until {until} ms: writes flake at random"));
            cluster.ha.outage_until = until;
        }
        3 => {
            let flake = draw_flake(&mut cluster.rng);
            cluster.trace.push(format!("fault: the next HA write: {flake:?}"));
            cluster.ha.flake = Some(flake);
        }
        4 => {
            let other = 1 - jm;
            if matches!(cluster.jms[other], JobManager::Standby) {
                cluster.trace.push(format!("fault: JM{other} (standby) killed"));
                cluster.jms[other] = JobManager::Dead { restart_at: cluster.now_ms + 50 + cluster.rng.below(400) };
            }
        }
        _ => {}
    }
}

/// The invariants, after every step.
fn check(cluster: &mut Cluster) {
    let leading: Vec<u64> = cluster
        .jms
        .iter()
        .filter_map(|jm| match jm {
            JobManager::Leading(master) => Some(master.epoch),
            _ => None,
        })
        .collect();
    if leading.len() == 2 && leading[0] == leading[1] {
        cluster.violation(format!("two JobManagers lead epoch {}", leading[0]));
    }
    if let Some(jm) = leader(cluster) {
        cluster.check_slots(jm);
    }
    for subtask in 0..cluster.shape.subtasks {
        if let Err(error) = cluster.external.committed_prefix(subtask) {
            cluster.violation(error);
        }
    }
    for location in restorable(cluster) {
        for subtask in 0..cluster.shape.subtasks {
            if let Err(error) = cluster.restore_state(&location, subtask) {
                cluster.violation(format!("a restorable snapshot is broken: {error}"));
                return;
            }
        }
    }
}

/// What a restore may use: the newest pointer in the HA store, every checkpoint the current
/// leader retains, every completed savepoint.
fn restorable(cluster: &Cluster) -> Vec<String> {
    let mut locations: Vec<String> = cluster.ha.pointers.values().next_back().cloned().into_iter().collect();
    if let Some(jm) = leader(cluster)
        && let JobManager::Leading(master) = &cluster.jms[jm]
    {
        locations.extend(master.book.retained().into_iter().map(|(_, location)| location));
    }
    locations.extend(cluster.savepoints.iter().map(|(_, location)| location.clone()));
    locations
}

/// Once faults stopped, the job must finish with every record committed exactly once.
fn finish_check(cluster: &mut Cluster) {
    if !cluster.ha.finished {
        let steps = cluster.step;
        cluster.violation(format!(
            "the job did not finish within {steps} steps ({} without faults)",
            steps - cluster.shape.fault_steps.min(steps)
        ));
        return;
    }
    if let Some(jm) = leader(cluster) {
        cluster.check_slots_free(jm);
    }
    for subtask in 0..cluster.shape.subtasks {
        match cluster.external.committed_prefix(subtask) {
            Ok(n) if n == cluster.shape.records => {}
            Ok(n) => cluster.violation(format!("subtask {subtask} committed {n} of {} records", cluster.shape.records)),
            Err(error) => cluster.violation(error),
        }
    }
}

#[cfg(test)]
mod tests;
