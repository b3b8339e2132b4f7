//! The simulated cluster's TaskManagers and the leader's real [`SlotLedger`]: TaskManager `i`
//! offers one slot at `tm<i>:data`, so subtask `i` of an attempt runs there whenever every
//! TaskManager is registered. A new leader's term starts a new ledger; the TaskManagers it
//! can reach register with it, reporting the attempts they still run (the current one, and
//! replaced ones whose cancel has not reached them), and the ledger decides which reports are
//! kept for a takeover and which are cancelled. A TaskManager the leader counts lost
//! registers again once it can (its connection back, its partition healed), and an attempt
//! that lacks a slot waits for it. The ledger's cancels travel on the network as
//! `Body::Cancel`. Checked after every step: the ledger's own books agree, the job holds the
//! slots of its running attempt and nothing else, an attempt never waits while every
//! TaskManager is registered (a slot held for nobody), and a finished job holds none.

use std::collections::{BTreeMap, BTreeSet};

use weir_types::ExecutionState;

use super::cluster::{Body, Cluster, Destination, JobManager, RECONCILE_TIMEOUT_MS};
use crate::cluster::protocol::RunningAttempt;
use crate::cluster::slots::{AttemptSlot, Cancel, SlotLedger};
use crate::executor::{ReportedAttempt, ReportedSubtask};

/// How long a TaskManager the leader counted lost takes to connect again, at the least.
const RECONNECT_MS: u64 = 20;

/// One leader's term of the cluster's slots.
pub struct LeaderSlots {
    pub ledger: SlotLedger,
    /// The job and the slots its running attempt uses.
    pub held: Option<(String, Vec<AttemptSlot>)>,
    /// TaskManagers registered in this term.
    pub registered: BTreeSet<u32>,
    /// When each TaskManager not registered yet registers, once it can reach the leader (it
    /// was counted lost, or is slow to find a new leader).
    pub registers_at: BTreeMap<u32, u64>,
    /// Allocations of the running attempt that went with a TaskManager counted lost.
    pub lost_allocations: BTreeSet<u64>,
    /// An attempt waiting for slots: its job and the snapshot it starts from.
    pub waiting: Option<(String, Option<String>)>,
}

impl LeaderSlots {
    /// A new leader's ledger: reports are kept until it recovered its jobs.
    pub fn new_term() -> LeaderSlots {
        LeaderSlots {
            ledger: SlotLedger::new(true),
            held: None,
            registered: BTreeSet::new(),
            registers_at: BTreeMap::new(),
            lost_allocations: BTreeSet::new(),
            waiting: None,
        }
    }

    /// The running attempt ended: its slots go back.
    pub fn release(&mut self) {
        if let Some((job, slots)) = self.held.take() {
            self.ledger.release(&job, &slots);
        }
        self.lost_allocations.clear();
    }

    /// The job ended: its attempt's slots go back, and an attempt waiting for slots gives up.
    pub fn abandon(&mut self) {
        self.release();
        if let Some((job, _)) = self.waiting.take() {
            self.ledger.stop_waiting(&job);
        }
    }
}

pub fn taskmanager_id(subtask: u32) -> String {
    format!("tm{subtask}")
}

fn data_address(subtask: u32) -> String {
    format!("tm{subtask}:data")
}

impl Cluster {
    pub fn job_id(&self) -> String {
        format!("job{}", self.job)
    }

    fn leader_slots(&mut self, jm: usize) -> Option<&mut LeaderSlots> {
        match &mut self.jms[jm] {
            JobManager::Leading(master) => Some(&mut master.slots),
            _ => None,
        }
    }

    /// What TaskManager `tm` reports running when it registers: its subtask of the current
    /// attempt and of replaced attempts it has not stopped yet.
    fn reports_of(&self, tm: u32) -> Vec<RunningAttempt> {
        let addresses: Vec<String> = (0..self.shape.subtasks).map(data_address).collect();
        let current = self.tasks.iter().filter(|task| task.subtask == tm);
        let zombies = self.zombies.iter().map(|zombie| &zombie.task).filter(|task| task.subtask == tm);
        current
            .chain(zombies)
            .map(|task| {
                let state = if task.finished { ExecutionState::Finished } else { ExecutionState::Running };
                let subtask = ReportedSubtask {
                    vertex: 0,
                    subtask: tm,
                    state,
                    data_ended: task.ended,
                    taskmanager: taskmanager_id(tm),
                };
                let attempt = ReportedAttempt {
                    attempt: task.attempt as u32,
                    region: None,
                    slot_addresses: addresses.clone(),
                    subtasks: vec![subtask],
                };
                RunningAttempt { job_id: format!("job{}", task.job), attempt }
            })
            .collect()
    }

    /// TaskManager `tm` registers with leader `jm`, reporting what it runs.
    fn register(&mut self, jm: usize, tm: u32) {
        let running = self.reports_of(tm);
        let reported = running.len();
        let Some(slots) = self.leader_slots(jm) else { return };
        let cancels = slots.ledger.register(&taskmanager_id(tm), 1, data_address(tm), running);
        slots.registered.insert(tm);
        slots.registers_at.remove(&tm);
        self.trace.push(format!("  TM{tm} registers with JM{jm} ({reported} attempt(s) reported)"));
        // Registered, its subtasks follow this leader.
        let epoch = self.ha.epoch;
        let zombies = self.zombies.iter_mut().map(|zombie| &mut zombie.task);
        for task in self.tasks.iter_mut().chain(zombies).filter(|task| task.subtask == tm) {
            task.epoch = epoch;
            task.leader = jm;
        }
        self.carry_cancels(jm, cancels);
    }

    /// A new term: every TaskManager the leader can reach registers, one in three of them
    /// late (up to twice the reconcile timeout: it was slow to find the new leader); then
    /// the leader recovers its job (none once the job ended).
    pub fn start_slot_term(&mut self, jm: usize, ended: bool) {
        for tm in 0..self.shape.subtasks {
            if self.rng.one_in(3) {
                let at = self.now_ms + self.rng.below(2 * RECONCILE_TIMEOUT_MS);
                if let Some(slots) = self.leader_slots(jm) {
                    slots.registers_at.insert(tm, at);
                }
            } else if !self.is_cut((tm as usize, tm as usize)) {
                self.register(jm, tm);
            }
        }
        let jobs = if ended { Vec::new() } else { vec![self.job_id()] };
        let Some(slots) = self.leader_slots(jm) else { return };
        let cancels = slots.ledger.recovered(&jobs);
        self.carry_cancels(jm, cancels);
    }

    /// The job master left RECONCILING: what is still reported of its job is cancelled.
    pub fn settle_slots(&mut self, jm: usize) {
        let job = self.job_id();
        let Some(slots) = self.leader_slots(jm) else { return };
        let cancels = slots.ledger.settle(&job);
        self.carry_cancels(jm, cancels);
    }

    /// The ledger's cancels go to the TaskManagers, behind what is in flight to them.
    pub fn carry_cancels(&mut self, jm: usize, cancels: Vec<Cancel>) {
        let epoch = self.ha.epoch;
        for Cancel { taskmanager, job_id, attempt } in cancels {
            let Some(tm) = taskmanager.strip_prefix("tm").and_then(|n| n.parse::<u32>().ok()) else { continue };
            self.trace.push(format!("  JM{jm} cancels {job_id}'s attempt {attempt} on TM{tm}"));
            self.send(1000 + jm, tm as usize, epoch, attempt as u64, Destination::Task(tm), Body::Cancel);
        }
    }

    /// The leader counts TaskManager `tm` lost: its slots go, and it registers again later.
    pub fn taskmanager_lost(&mut self, jm: usize, tm: u32) {
        let now = self.now_ms;
        let Some(slots) = self.leader_slots(jm) else { return };
        let id = taskmanager_id(tm);
        slots.ledger.lost(&id);
        slots.registered.remove(&tm);
        if let Some((_, held)) = &slots.held {
            slots
                .lost_allocations
                .extend(held.iter().filter(|(_, on, _)| *on == id).map(|(allocation, _, _)| *allocation));
        }
        slots.registers_at.insert(tm, now + RECONNECT_MS);
    }

    /// TaskManagers the leader lost and can reach again register; an attempt waiting for
    /// slots then starts.
    pub fn reconnect_taskmanagers(&mut self, jm: usize) {
        let now = self.now_ms;
        let JobManager::Leading(master) = &self.jms[jm] else { return };
        let slots = &master.slots;
        // Due to register, or out of reach when the term began.
        let due: Vec<u32> = (0..self.shape.subtasks)
            .filter(|tm| match slots.registers_at.get(tm) {
                Some(at) => *at <= now,
                None => !slots.registered.contains(tm),
            })
            .filter(|tm| !self.is_cut((*tm as usize, *tm as usize)))
            .collect();
        let any = !due.is_empty();
        for tm in due {
            self.register(jm, tm);
        }
        if any {
            self.start_waiting_attempt(jm);
        }
    }

    /// Slots for a new attempt from `location`: the replaced attempt's go back, and the new
    /// one starts once the job has one on every TaskManager, else it waits.
    pub fn allocate_attempt(&mut self, jm: usize, location: Option<String>) {
        let job = self.job_id();
        let Some(slots) = self.leader_slots(jm) else { return };
        slots.release();
        slots.waiting = Some((job, location));
        self.start_waiting_attempt(jm);
    }

    /// Starts the attempt waiting for slots if the ledger has them.
    pub fn start_waiting_attempt(&mut self, jm: usize) {
        let (job, count) = (self.job_id(), self.shape.subtasks as usize);
        let Some(slots) = self.leader_slots(jm) else { return };
        let Some((_, location)) = slots.waiting.clone() else { return };
        match slots.ledger.try_allocate(&job, count) {
            Some(allocated) => {
                slots.waiting = None;
                slots.held = Some((job, allocated));
                self.start_attempt(jm, location);
            }
            None => {
                let registered = slots.registered.len();
                self.trace.push(format!("  the attempt waits for slots ({registered} TaskManagers registered)"));
                if registered == count {
                    self.violation(format!(
                        "an attempt of {job} waits for {count} slots while all {count} TaskManagers are registered: slots held for nobody"
                    ));
                }
            }
        }
    }

    /// The job holds exactly its running attempt's slots, and the ledger's books agree.
    pub fn check_slots(&mut self, jm: usize) {
        let job = self.job_id();
        let JobManager::Leading(master) = &self.jms[jm] else { return };
        let slots = &master.slots;
        let mut problems = Vec::new();
        if let Err(error) = slots.ledger.audit() {
            problems.push(format!("slot ledger of JM{jm}: {error}"));
        }
        let held: BTreeSet<u64> = match &slots.held {
            Some((held_job, allocated)) if *held_job == job => allocated.iter().map(|(id, _, _)| *id).collect(),
            _ => BTreeSet::new(),
        };
        // Slots on a TaskManager counted lost went with it.
        let expected: BTreeSet<u64> = held.difference(&slots.lost_allocations).copied().collect();
        let actual = slots.ledger.allocations(&job);
        if actual != expected {
            problems.push(format!("{job} holds slots {actual:?}, its running attempt {expected:?}"));
        }
        for problem in problems {
            self.violation(problem);
        }
    }

    /// Once the job ended, its leader's ledger holds nothing and every slot is free.
    pub fn check_slots_free(&mut self, jm: usize) {
        let JobManager::Leading(master) = &mut self.jms[jm] else { return };
        // A result whose answer was lost is read back at the leader's next tick, and the
        // attempt's slots go back then.
        master.slots.abandon();
        let ledger = &master.slots.ledger;
        let busy: Vec<String> = ledger
            .offers()
            .into_iter()
            .filter(|(_, _, slots, free)| free < slots)
            .map(|(id, _, slots, free)| format!("{id} ({free} of {slots} free)"))
            .collect();
        if !ledger.holds_nothing() || !busy.is_empty() {
            self.violation(format!("the job ended, yet slots are held: {}", busy.join(", ")));
        }
    }
}
