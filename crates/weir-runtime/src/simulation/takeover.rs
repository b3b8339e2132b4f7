//! A new leader's RECONCILING in the simulated cluster, decided by the job master's real rules
//! ([`crate::job_master::takeover`]): the newest reported attempt is kept (older ones are
//! cancelled), and once the reports cover every subtask the leader takes it over (its real
//! slot ledger adopts the slots), sends the newest completed checkpoint again and aborts what
//! the old leader left in flight. A report that stays incomplete past the reconcile timeout
//! is a failure the restart strategy decides on.

use super::cluster::{Body, Cluster, JobManager, RECONCILE_TIMEOUT_MS};
use crate::job_master::takeover::{self, ReconcileDecision};

impl Cluster {
    /// Leader `jm` recovered a job whose attempt may still run: it reconciles until the
    /// TaskManagers reported it, or the timeout.
    pub fn start_reconciling(&mut self, jm: usize) {
        let deadline = self.now_ms + RECONCILE_TIMEOUT_MS;
        if let JobManager::Leading(master) = &mut self.jms[jm] {
            master.reconciling_until = Some(deadline);
        }
        self.trace.push(format!("  JM{jm} reconciles until {deadline} ms"));
        self.reconcile(jm);
    }

    /// Looks at what was reported so far and decides, as `states/reconciling.rs` does.
    pub fn reconcile(&mut self, jm: usize) {
        let (job, now) = (self.job_id(), self.now_ms);
        let JobManager::Leading(master) = &mut self.jms[jm] else { return };
        let Some(deadline) = master.reconciling_until else { return };
        let ledger = &mut master.slots.ledger;
        let (kept, stale) = takeover::newest_per_region(ledger.running_attempts(&job), false);
        let mut cancels = Vec::new();
        for attempt in stale {
            cancels.extend(ledger.cancel_reported(&job, attempt));
        }
        let coverage = takeover::coverage(&kept, self.shape.subtasks as usize, |_, _| true);
        let decision = takeover::decide(&coverage, false, now >= deadline, &format!("{RECONCILE_TIMEOUT_MS} ms"));
        self.carry_cancels(jm, cancels);
        match decision {
            ReconcileDecision::Wait | ReconcileDecision::Cancel => {}
            ReconcileDecision::TakeOver => {
                let Some(attempt) = kept.into_iter().next() else { return };
                self.take_attempt_over(jm, &job, attempt);
            }
            ReconcileDecision::GiveUp(reason) => {
                self.trace.push(format!("  JM{jm} gives up reconciling: {reason}"));
                self.end_reconciling(jm);
                self.fail_over(jm, &reason);
            }
        }
    }

    /// Leaves RECONCILING: every report not taken over is cancelled.
    pub fn end_reconciling(&mut self, jm: usize) {
        if let JobManager::Leading(master) = &mut self.jms[jm] {
            master.reconciling_until = None;
        }
        self.settle_slots(jm);
    }

    /// Takes `attempt` over: its slots adopted, then the newest completed checkpoint sent
    /// again and every later one the old leader may have left in flight aborted.
    fn take_attempt_over(&mut self, jm: usize, job: &str, attempt: crate::executor::ReportedAttempt) {
        let JobManager::Leading(master) = &mut self.jms[jm] else { return };
        let slots = &mut master.slots;
        match slots.ledger.adopt_slots(job, &attempt.slot_addresses) {
            Ok(adopted) => {
                slots.ledger.take_over(job, attempt.attempt);
                slots.held = Some((job.to_string(), adopted));
            }
            Err((what, why)) => {
                let reason = format!("{what}: {why}");
                self.end_reconciling(jm);
                return self.fail_over(jm, &reason);
            }
        }
        let latest = master.book.latest_retained().map(|(id, _)| id);
        let (recommit, abandoned) = takeover::after_takeover(latest, master.book.next_id());
        self.trace.push(format!("  JM{jm} takes attempt {} over", attempt.attempt));
        self.end_reconciling(jm);
        if let Some(id) = recommit {
            self.send_to_tasks(jm, |_| Body::Complete { id });
        }
        for id in abandoned {
            self.send_to_tasks(jm, |_| Body::Aborted(id));
        }
    }
}
