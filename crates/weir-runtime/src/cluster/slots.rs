//! The JobManager's slot ledger: which TaskManager offers how many slots, which slots each
//! job holds, which attempts the TaskManagers reported running (a new leader takes them
//! over) and the slots those hold meanwhile. A pure state machine: events in (a TaskManager
//! registers or is lost, a leader recovered its jobs, a job settles, an attempt allocates,
//! takes over or releases slots), answers and [`Cancel`]s out. [`super::resources`] carries
//! the cancels to the TaskManagers; the property test below checks the bookkeeping over any
//! sequence of events: a slot is never held for nobody (a reservation outliving every
//! attempt it was for was a bug of the last review round).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::execution::{TaskEvent, TaskEventKind};
use crate::executor::ReportedAttempt;

use super::protocol::RunningAttempt;

/// A slot an attempt uses: (allocation id, TaskManager id, data address).
pub(crate) type AttemptSlot = (u64, String, String);

/// Stop attempt `attempt` of job `job_id` on TaskManager `taskmanager`: nobody takes it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cancel {
    pub(crate) taskmanager: String,
    pub(crate) job_id: String,
    pub(crate) attempt: u32,
}

/// One TaskManager's slots.
#[derive(Debug)]
struct TaskManagerSlots {
    slots: u32,
    /// Slots in use, those reserved for reported attempts included.
    used: u32,
    /// Per job, slots of attempts this TaskManager kept running without a JobManager, held
    /// for the job until its master takes them over (or stops them).
    reserved: BTreeMap<String, u32>,
    data_address: String,
}

/// An attempt the TaskManagers reported running when they registered, until its job master
/// takes it over.
pub(crate) struct Reported {
    pub(crate) attempt: ReportedAttempt,
    /// The TaskManagers running part of it.
    taskmanagers: BTreeSet<String>,
    /// Its subtasks' events that came before the takeover, replayed to the master then.
    pending: Vec<TaskEvent>,
}

impl Reported {
    /// True when `taskmanager` reported running subtask `(vertex, subtask)` of the attempt.
    fn runs(&self, taskmanager: &str, vertex: usize, subtask: u32) -> bool {
        self.attempt.subtasks.iter().any(|s| s.vertex == vertex && s.subtask == subtask && s.taskmanager == taskmanager)
    }

    /// Applies a subtask's event that came before the takeover to its reported state.
    fn note(&mut self, event: &TaskEvent) {
        let Some(subtask) =
            self.attempt.subtasks.iter_mut().find(|s| s.vertex == event.vertex && s.subtask == event.subtask)
        else {
            return;
        };
        use weir_types::ExecutionState as State;
        match &event.kind {
            TaskEventKind::Initializing => subtask.state = State::Initializing,
            TaskEventKind::Running => subtask.state = State::Running,
            TaskEventKind::EndOfData => subtask.data_ended = true,
            TaskEventKind::Finished => subtask.state = State::Finished,
            TaskEventKind::Failed(_) => subtask.state = State::Failed,
            TaskEventKind::Canceled => subtask.state = State::Canceled,
        }
    }
}

/// Which reports of running attempts a registering TaskManager's are kept for a job master
/// to take over; the others are cancelled on that TaskManager at once, so they hold no slot
/// and no thread.
#[derive(Default)]
struct ReportPolicy {
    /// A new leader has not recovered its jobs from the HA store yet: every report is kept
    /// (its job may be among them).
    recovering: bool,
    /// Jobs recovered RECONCILING: their master takes reported attempts over.
    reconciling: HashSet<String>,
    /// Jobs whose master left RECONCILING in this term: a report of theirs is stale (a
    /// TaskManager frozen or cut off past the takeover), whatever it says.
    settled: HashSet<String>,
}

impl ReportPolicy {
    fn keeps(&self, job_id: &str) -> bool {
        !self.settled.contains(job_id) && (self.recovering || self.reconciling.contains(job_id))
    }
}

/// The slots a job's attempts share: subtask `i` of every pipelined region runs in the job's
/// slot `i`, as in Flink's default slot sharing group, so a job needs as many slots as its
/// highest parallelism however many regions it has.
#[derive(Default)]
struct JobSlots {
    /// Slot index -> the allocation that serves it now.
    by_index: Vec<Option<u64>>,
    /// Allocations by id, with the attempts using each.
    held: HashMap<u64, SharedSlot>,
}

/// One TaskManager slot a job holds.
struct SharedSlot {
    taskmanager: String,
    data_address: String,
    /// Attempts (regions) using it; the slot goes back to its TaskManager at 0.
    users: u32,
}

/// Every slot of the cluster, as one leader's term sees it.
#[derive(Default)]
pub(crate) struct SlotLedger {
    taskmanagers: BTreeMap<String, TaskManagerSlots>,
    jobs: HashMap<String, JobSlots>,
    next_allocation: u64,
    /// Attempts reported at registration and not taken over yet, by (job, attempt).
    reported: HashMap<(String, u32), Reported>,
    policy: ReportPolicy,
    /// Per job, slots an attempt waits for that no TaskManager offers yet.
    waiting: HashMap<String, u32>,
}

impl SlotLedger {
    /// A ledger for a new leader's term (`recovering`: reports are kept until it recovered
    /// its jobs) or for a JobManager without high availability, which takes nothing over.
    pub(crate) fn new(recovering: bool) -> SlotLedger {
        SlotLedger { policy: ReportPolicy { recovering, ..ReportPolicy::default() }, ..SlotLedger::default() }
    }

    /// Whether TaskManager `id` is registered.
    #[cfg(test)]
    pub(crate) fn has(&self, id: &str) -> bool {
        self.taskmanagers.contains_key(id)
    }

    /// TaskManager `id` registered with `slots` at `data_address`, running `running`: the
    /// attempts kept for a master to take over hold their slots; the others are cancelled.
    pub(crate) fn register(
        &mut self,
        id: &str,
        slots: u32,
        data_address: String,
        running: Vec<RunningAttempt>,
    ) -> Vec<Cancel> {
        let mut slots_per_job: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        let mut stale = Vec::new();
        for RunningAttempt { job_id, mut attempt } in running {
            if !self.policy.keeps(&job_id) {
                stale.push(Cancel { taskmanager: id.to_string(), job_id, attempt: attempt.attempt });
                continue;
            }
            for subtask in &mut attempt.subtasks {
                subtask.taskmanager = id.to_string();
                slots_per_job.entry(job_id.clone()).or_default().insert(subtask.subtask);
            }
            let key = (job_id, attempt.attempt);
            let entry = self.reported.entry(key).or_insert_with(|| Reported {
                attempt: ReportedAttempt { subtasks: Vec::new(), ..attempt.clone() },
                taskmanagers: BTreeSet::new(),
                pending: Vec::new(),
            });
            entry.taskmanagers.insert(id.to_string());
            entry.attempt.subtasks.retain(|s| s.taskmanager != id);
            entry.attempt.subtasks.extend(attempt.subtasks);
        }
        let reserved: BTreeMap<String, u32> =
            slots_per_job.into_iter().map(|(job, slots)| (job, slots.len() as u32)).collect();
        let used = reserved.values().sum();
        self.taskmanagers.insert(id.to_string(), TaskManagerSlots { slots, used, reserved, data_address });
        stale
    }

    /// TaskManager `id` is gone: its slots with it, and its part of attempts not taken over.
    /// Its data address, if it was registered.
    pub(crate) fn lost(&mut self, id: &str) -> Option<String> {
        let removed = self.taskmanagers.remove(id)?;
        // The slots jobs held there are gone too: the attempts using them release nothing
        // later, and a TaskManager that comes back under the same id (a partition healed)
        // starts with all its slots free. Kept, a late release would have freed a slot of its
        // new registration that another job uses (found by the property test below).
        for job in self.jobs.values_mut() {
            job.held.retain(|_, slot| slot.taskmanager != id);
            for index in job.by_index.iter_mut() {
                if index.is_some_and(|allocation| !job.held.contains_key(&allocation)) {
                    *index = None;
                }
            }
        }
        for reported in self.reported.values_mut() {
            if reported.taskmanagers.remove(id) {
                reported.attempt.subtasks.retain(|s| s.taskmanager != id);
            }
        }
        Some(removed.data_address)
    }

    /// A new leader recovered `jobs` from the HA store, each RECONCILING: from now on only
    /// their reports are kept (until each settles); what else was reported is cancelled.
    pub(crate) fn recovered(&mut self, jobs: &[String]) -> Vec<Cancel> {
        self.policy.recovering = false;
        for job in jobs {
            if !self.policy.settled.contains(job) {
                self.policy.reconciling.insert(job.clone());
            }
        }
        let stale: Vec<(String, u32)> =
            self.reported.keys().filter(|(job, _)| !self.policy.keeps(job)).cloned().collect();
        stale.into_iter().flat_map(|(job, attempt)| self.cancel_reported(&job, attempt)).collect()
    }

    /// `job_id`'s master left RECONCILING (it took the reported attempts over, or gave up and
    /// restarts): every attempt of it still reported is cancelled, its reservations freed,
    /// and later reports of it are cancelled at once.
    pub(crate) fn settle(&mut self, job_id: &str) -> Vec<Cancel> {
        self.policy.reconciling.remove(job_id);
        self.policy.settled.insert(job_id.to_string());
        let left: Vec<u32> =
            self.reported.keys().filter(|(job, _)| job == job_id).map(|(_, attempt)| *attempt).collect();
        let mut cancels = Vec::new();
        for attempt in left {
            tracing::info!(job_id = %job_id, attempt, "cancelling a reported attempt that was not taken over");
            cancels.extend(self.cancel_reported(job_id, attempt));
        }
        self.release_reservations(job_id);
        cancels
    }

    /// Forgets a reported attempt: it is stopped on the TaskManagers running it.
    pub(crate) fn cancel_reported(&mut self, job_id: &str, attempt: u32) -> Vec<Cancel> {
        let Some(reported) = self.reported.remove(&(job_id.to_string(), attempt)) else {
            return Vec::new();
        };
        self.release_reservations(job_id);
        let to = |taskmanager: String| Cancel { taskmanager, job_id: job_id.to_string(), attempt };
        reported.taskmanagers.into_iter().map(to).collect()
    }

    /// The reported attempts of `job_id`, by attempt number.
    pub(crate) fn running_attempts(&self, job_id: &str) -> Vec<ReportedAttempt> {
        let mut attempts: Vec<ReportedAttempt> =
            self.reported.iter().filter(|((job, _), _)| job == job_id).map(|(_, r)| r.attempt.clone()).collect();
        attempts.sort_by_key(|a| a.attempt);
        attempts
    }

    /// Keeps an event of a reported attempt's subtask for the master that takes it over;
    /// false when `taskmanager` does not run that subtask of it (or it is not reported).
    pub(crate) fn note_event(&mut self, taskmanager: &str, key: &(String, u32), event: TaskEvent) -> Option<bool> {
        let reported = self.reported.get_mut(key)?;
        if !reported.runs(taskmanager, event.vertex, event.subtask) {
            return Some(false);
        }
        reported.note(&event);
        reported.pending.push(event);
        Some(true)
    }

    /// A reported attempt is taken over: it is no longer reported, and what its job still
    /// reserves goes once no reported attempt of it is left. Its events so far.
    pub(crate) fn take_over(&mut self, job_id: &str, attempt: u32) -> Vec<TaskEvent> {
        let pending = self.reported.remove(&(job_id.to_string(), attempt)).map(|r| r.pending).unwrap_or_default();
        self.release_reservations(job_id);
        pending
    }

    /// Frees what TaskManagers still reserve for `job_id` once no reported attempt of it is
    /// left to take over.
    fn release_reservations(&mut self, job_id: &str) {
        if self.reported.keys().any(|(job, _)| job == job_id) {
            return;
        }
        for tm in self.taskmanagers.values_mut() {
            if let Some(reserved) = tm.reserved.remove(job_id) {
                tm.used = tm.used.saturating_sub(reserved);
            }
        }
    }

    /// The job's slots `0..count` for one attempt when the TaskManagers have enough free
    /// slots for those it lacks (taken now, spread round-robin); `None`, and the job counted
    /// as waiting for the slots it lacks, otherwise. Slots other attempts of the job hold
    /// are shared, not taken again.
    pub(crate) fn try_allocate(&mut self, job_id: &str, count: usize) -> Option<Vec<AttemptSlot>> {
        let job = self.jobs.entry(job_id.to_string()).or_default();
        if job.by_index.len() < count {
            job.by_index.resize(count, None);
        }
        let taskmanagers = &mut self.taskmanagers;
        let missing: Vec<usize> = (0..count)
            .filter(|&index| {
                !job.by_index[index]
                    .and_then(|id| job.held.get(&id))
                    .is_some_and(|slot| taskmanagers.contains_key(&slot.taskmanager))
            })
            .collect();
        let free: u32 = taskmanagers.values().map(|tm| tm.slots.saturating_sub(tm.used)).sum();
        if (free as usize) < missing.len() {
            self.waiting.insert(job_id.to_string(), missing.len() as u32);
            return None;
        }
        self.waiting.remove(job_id);
        place_slots(taskmanagers, job, missing, &mut self.next_allocation);
        let mut slots = Vec::with_capacity(count);
        for index in 0..count {
            let Some(id) = job.by_index[index] else { continue };
            if let Some(slot) = job.held.get_mut(&id) {
                slot.users += 1;
                slots.push((id, slot.taskmanager.clone(), slot.data_address.clone()));
            }
        }
        Some(slots)
    }

    /// A job gave up waiting for slots.
    pub(crate) fn stop_waiting(&mut self, job_id: &str) {
        self.waiting.remove(job_id);
        // Forget a job that holds nothing (its first attempt never got slots).
        if self.jobs.get(job_id).is_some_and(|job| job.held.is_empty()) {
            self.jobs.remove(job_id);
        }
    }

    /// An attempt of `job_id` ended: each slot it used has one user less, and a slot nobody
    /// uses goes back to its TaskManager.
    pub(crate) fn release(&mut self, job_id: &str, slots: &[AttemptSlot]) {
        let Some(job) = self.jobs.get_mut(job_id) else { return };
        for (id, _, _) in slots {
            let Some(slot) = job.held.get_mut(id) else { continue };
            slot.users = slot.users.saturating_sub(1);
            if slot.users > 0 {
                continue;
            }
            if let Some(slot) = job.held.remove(id)
                && let Some(tm) = self.taskmanagers.get_mut(&slot.taskmanager)
            {
                tm.used = tm.used.saturating_sub(1);
            }
            for index in job.by_index.iter_mut() {
                if *index == Some(*id) {
                    *index = None;
                }
            }
        }
        if job.held.is_empty() {
            self.jobs.remove(job_id);
        }
    }

    /// The job's slots for a reported attempt taken over: slot `i` on the TaskManager whose
    /// data address is `slot_addresses[i]` (it holds the slot for the job since it
    /// registered, or the job holds it already for another region's attempt). Every slot's
    /// TaskManager is checked first: a failure takes nothing (no slot held for nobody).
    /// An error is (what was being done, why it failed).
    pub(crate) fn adopt_slots(
        &mut self,
        job_id: &str,
        slot_addresses: &[String],
    ) -> Result<Vec<AttemptSlot>, (String, String)> {
        let mut owners = Vec::with_capacity(slot_addresses.len());
        for (index, address) in slot_addresses.iter().enumerate() {
            let owner = self.taskmanagers.iter().find(|(_, tm)| tm.data_address == *address).map(|(id, _)| id.clone());
            let Some(owner) = owner else {
                return Err((
                    format!("taking over slot {index} of job {job_id}"),
                    format!("the TaskManager at {address} has not registered with this JobManager"),
                ));
            };
            owners.push(owner);
        }
        let job = self.jobs.entry(job_id.to_string()).or_default();
        if job.by_index.len() < slot_addresses.len() {
            job.by_index.resize(slot_addresses.len(), None);
        }
        let mut slots = Vec::with_capacity(slot_addresses.len());
        for (index, (address, owner)) in slot_addresses.iter().zip(owners).enumerate() {
            let held = job.by_index[index].filter(|id| job.held.get(id).is_some_and(|slot| slot.taskmanager == owner));
            let allocation = match held {
                Some(allocation) => allocation,
                None => {
                    let allocation = self.next_allocation;
                    self.next_allocation += 1;
                    if let Some(tm) = self.taskmanagers.get_mut(&owner) {
                        match tm.reserved.get_mut(job_id) {
                            Some(reserved) if *reserved > 0 => *reserved -= 1,
                            _ => tm.used += 1,
                        }
                    }
                    let slot = SharedSlot { taskmanager: owner.clone(), data_address: address.clone(), users: 0 };
                    job.held.insert(allocation, slot);
                    job.by_index[index] = Some(allocation);
                    allocation
                }
            };
            if let Some(slot) = job.held.get_mut(&allocation) {
                slot.users += 1;
            }
            slots.push((allocation, owner, address.clone()));
        }
        Ok(slots)
    }

    /// Slots the jobs need: those in use plus those attempts wait for.
    pub(crate) fn slots_demanded(&self) -> u32 {
        self.taskmanagers.values().map(|tm| tm.used).sum::<u32>() + self.waiting.values().sum::<u32>()
    }

    /// Each TaskManager's (id, data address, slots, free slots), by id.
    pub(crate) fn offers(&self) -> Vec<(String, String, u32, u32)> {
        let free = |tm: &TaskManagerSlots| tm.slots.saturating_sub(tm.used);
        self.taskmanagers.iter().map(|(id, tm)| (id.clone(), tm.data_address.clone(), tm.slots, free(tm))).collect()
    }

    /// Whether nothing is reported (for tests).
    #[cfg(test)]
    pub(crate) fn reported_count(&self) -> usize {
        self.reported.len()
    }

    /// Whether no job holds a slot (for tests).
    #[cfg(test)]
    pub(crate) fn holds_nothing(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The allocations `job_id` holds (for tests).
    #[cfg(test)]
    pub(crate) fn allocations(&self, job_id: &str) -> BTreeSet<u64> {
        self.jobs.get(job_id).map(|job| job.held.keys().copied().collect()).unwrap_or_default()
    }

    /// The ledger's own books agree: every TaskManager's used slots are the allocations on
    /// it plus its reservations, never more than it offers; no job reserves a slot unless an
    /// attempt of it is still reported (a slot held for nobody); no settled job has a
    /// reported attempt.
    #[cfg(test)]
    pub(crate) fn audit(&self) -> Result<(), String> {
        for (id, tm) in &self.taskmanagers {
            let held =
                self.jobs.values().flat_map(|job| job.held.values()).filter(|slot| slot.taskmanager == *id).count();
            let reserved: u32 = tm.reserved.values().sum();
            if tm.used != held as u32 + reserved {
                return Err(format!("{id}: {} used, {held} held + {reserved} reserved", tm.used));
            }
            if tm.used > tm.slots {
                return Err(format!("{id}: {} used of {}", tm.used, tm.slots));
            }
            for (job, count) in &tm.reserved {
                if *count > 0 && !self.reported.keys().any(|(reported, _)| reported == job) {
                    return Err(format!("{id} reserves {count} slot(s) for {job}, which has no reported attempt"));
                }
            }
        }
        if let Some((job, attempt)) = self.reported.keys().find(|(job, _)| self.policy.settled.contains(job)) {
            return Err(format!("settled job {job} still has attempt {attempt} reported"));
        }
        Ok(())
    }
}

/// Takes a free TaskManager slot for each of the job's slot indexes `missing`, spread over
/// the TaskManagers round-robin by id; the TaskManagers have enough free ones, so every
/// pass places at least one.
fn place_slots(
    taskmanagers: &mut BTreeMap<String, TaskManagerSlots>,
    job: &mut JobSlots,
    missing: Vec<usize>,
    next_allocation: &mut u64,
) {
    let mut pending = missing.into_iter().peekable();
    while pending.peek().is_some() {
        for (id, tm) in taskmanagers.iter_mut() {
            let Some(&index) = pending.peek() else { break };
            if tm.used >= tm.slots {
                continue;
            }
            tm.used += 1;
            let allocation = *next_allocation;
            *next_allocation += 1;
            let slot = SharedSlot { taskmanager: id.clone(), data_address: tm.data_address.clone(), users: 0 };
            job.held.insert(allocation, slot);
            job.by_index[index] = Some(allocation);
            pending.next();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::ReportedSubtask;
    use proptest::prelude::*;

    const TASKMANAGERS: [&str; 3] = ["a", "b", "c"];
    const JOBS: [&str; 2] = ["j0", "j1"];

    fn address(tm: &str) -> String {
        format!("{tm}:1")
    }

    /// A report of `job`'s `attempt` (parallelism 1) running on `tm`.
    fn report(job: &str, attempt: u32, tm: &str) -> RunningAttempt {
        let subtask = ReportedSubtask {
            vertex: 0,
            subtask: 0,
            state: weir_types::ExecutionState::Running,
            data_ended: false,
            taskmanager: tm.to_string(),
        };
        RunningAttempt {
            job_id: job.to_string(),
            attempt: ReportedAttempt {
                attempt,
                region: None,
                slot_addresses: vec![address(tm)],
                subtasks: vec![subtask],
            },
        }
    }

    /// A partition healed: the TaskManager registers again under its id while the attempt
    /// that used its slot before has not released it yet. Another job takes the slot; the
    /// late release must not free it.
    #[test]
    fn a_late_release_of_a_lost_taskmanagers_slot_frees_nothing_of_its_new_registration() {
        let mut ledger = SlotLedger::new(false);
        ledger.register("a", 1, address("a"), Vec::new());
        let old = ledger.try_allocate("j0", 1).unwrap();
        ledger.lost("a");
        ledger.register("a", 1, address("a"), Vec::new());
        let new = ledger.try_allocate("j1", 1).unwrap();
        ledger.release("j0", &old);
        assert_eq!(ledger.offers()[0].3, 0, "the slot j1 holds shows free");
        assert!(ledger.try_allocate("j0", 1).is_none(), "j0 was given j1's slot");
        ledger.stop_waiting("j0");
        ledger.release("j1", &new);
        assert_eq!(ledger.offers()[0].3, 1);
        assert!(ledger.holds_nothing());
    }

    #[derive(Clone, Debug)]
    enum Event {
        /// A TaskManager registers with 1..=3 slots, reporting attempts of jobs.
        Register {
            tm: usize,
            slots: u32,
            reports: Vec<(usize, u32)>,
        },
        Lost {
            tm: usize,
        },
        Recovered {
            jobs: Vec<usize>,
        },
        Settle {
            job: usize,
        },
        Allocate {
            job: usize,
            count: usize,
        },
        /// Release the `n`-th allocation still held.
        Release {
            n: usize,
        },
        /// Take the `n`-th reported attempt over.
        TakeOver {
            n: usize,
        },
        Cancel {
            n: usize,
        },
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0..3usize, 1..=3u32, proptest::collection::vec((0..2usize, 0..3u32), 0..3))
                .prop_map(|(tm, slots, reports)| Event::Register { tm, slots, reports }),
            (0..3usize).prop_map(|tm| Event::Lost { tm }),
            proptest::collection::vec(0..2usize, 0..3).prop_map(|jobs| Event::Recovered { jobs }),
            (0..2usize).prop_map(|job| Event::Settle { job }),
            (0..2usize, 1..4usize).prop_map(|(job, count)| Event::Allocate { job, count }),
            (0..4usize).prop_map(|n| Event::Release { n }),
            (0..4usize).prop_map(|n| Event::TakeOver { n }),
            (0..4usize).prop_map(|n| Event::Cancel { n }),
        ]
    }

    proptest! {
        #[test]
        fn no_event_sequence_leaves_a_slot_held_for_nobody(recovering in any::<bool>(), events in proptest::collection::vec(event(), 1..40)) {
            let mut ledger = SlotLedger::new(recovering);
            let mut allocations: Vec<(String, Vec<AttemptSlot>)> = Vec::new();
            for event in events {
                match event {
                    Event::Register { tm, slots, reports } => {
                        let id = TASKMANAGERS[tm];
                        if ledger.has(id) {
                            continue;
                        }
                        // A TaskManager reports at most one attempt per job, each in a slot
                        // of its own.
                        let mut seen = BTreeSet::new();
                        let running: Vec<RunningAttempt> = reports
                            .into_iter()
                            .filter(|(job, _)| seen.insert(*job))
                            .take(slots as usize)
                            .map(|(job, attempt)| report(JOBS[job], attempt, id))
                            .collect();
                        ledger.register(id, slots, address(id), running);
                    }
                    Event::Lost { tm } => {
                        ledger.lost(TASKMANAGERS[tm]);
                    }
                    Event::Recovered { jobs } => {
                        let jobs: Vec<String> = jobs.into_iter().map(|job| JOBS[job].to_string()).collect();
                        ledger.recovered(&jobs);
                    }
                    Event::Settle { job } => {
                        ledger.settle(JOBS[job]);
                    }
                    Event::Allocate { job, count } => {
                        match ledger.try_allocate(JOBS[job], count) {
                            Some(slots) => allocations.push((JOBS[job].to_string(), slots)),
                            None => ledger.stop_waiting(JOBS[job]),
                        }
                    }
                    Event::Release { n } => {
                        if !allocations.is_empty() {
                            let (job, slots) = allocations.remove(n % allocations.len());
                            ledger.release(&job, &slots);
                        }
                    }
                    Event::TakeOver { n } => {
                        // Reconciling takes over only an attempt whose subtasks are all
                        // reported (not one whose TaskManager was lost since).
                        let mut keys: Vec<(String, u32)> = ledger
                            .reported
                            .iter()
                            .filter(|(_, reported)| !reported.attempt.subtasks.is_empty())
                            .map(|(key, _)| key.clone())
                            .collect();
                        keys.sort();
                        if keys.is_empty() {
                            continue;
                        }
                        let (job, attempt) = keys[n % keys.len()].clone();
                        let addresses = ledger.reported[&(job.clone(), attempt)].attempt.slot_addresses.clone();
                        if let Ok(slots) = ledger.adopt_slots(&job, &addresses) {
                            ledger.take_over(&job, attempt);
                            allocations.push((job, slots));
                        }
                    }
                    Event::Cancel { n } => {
                        let mut keys: Vec<(String, u32)> = ledger.reported.keys().cloned().collect();
                        keys.sort();
                        if let Some((job, attempt)) = keys.get(n % keys.len().max(1)).cloned() {
                            ledger.cancel_reported(&job, attempt);
                        }
                    }
                }
                prop_assert_eq!(ledger.audit(), Ok(()));
            }
            // Every job settles and every attempt ends: every slot is free again.
            for job in JOBS {
                ledger.settle(job);
            }
            for (job, slots) in allocations {
                ledger.release(&job, &slots);
            }
            prop_assert_eq!(ledger.audit(), Ok(()));
            for (id, tm) in &ledger.taskmanagers {
                prop_assert_eq!(tm.used, 0, "{} still uses slots", id);
            }
            prop_assert!(ledger.holds_nothing());
        }
    }
}
