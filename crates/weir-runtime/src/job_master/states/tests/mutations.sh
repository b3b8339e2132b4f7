#!/usr/bin/env bash
# Shows that the job master's random-subtask test (random.rs) finds each rule it guards when
# that rule is broken: breaks each in turn (in the working tree, restored with git checkout
# after each run), runs the seeds and prints the first failure. Run from a clean working
# tree: it checks the files out again.
cd "$(dirname "$0")/../../../../../.."
S=crates/weir-runtime/src/job_master
if [ -n "$(git status --porcelain -- $S)" ]; then
  echo "$S has uncommitted changes; commit or stash them first (this script checks files out)" >&2
  exit 1
fi
run() { echo -n "$1: "; cargo test -q -p weir-runtime --lib job_master::states::tests::random 2>&1 | grep -E "^seed " | head -1; }
rev() { python3 -c "
import sys
p,old,new=sys.argv[1],sys.argv[2],sys.argv[3]
s=open(p).read()
assert old in s, (p, old)
open(p,'w').write(s.replace(old,new))" "$@"; }
rev $S/states/restarting.rs '                if !drained(run) {' '                if false {'; run "a job restarts once its failed attempt ended"; git checkout -q $S
rev $S/run.rs '                    *at <= now
                        && record' '                    *at <= now
                        || record'; run "a region redeploys once its subtasks ended"; git checkout -q $S
rev $S/states/going_down.rs '    if !drained(run) {' '    if false {'; run "a failed or cancelled job ends once its subtasks ended"; git checkout -q $S
rev $S/run.rs 'checkpoint_outcomes::on_failure(failure, &mut self.sup.final_checkpoint, false, 0)' 'checkpoint_outcomes::on_failure(failure, &mut self.sup.final_checkpoint.clone(), false, 0)'; run "an aborted final checkpoint is taken again"; git checkout -q $S
rev $S/run.rs ' && !self.sup.finishing);' ');'; run "a failure after Finish went out restarts the whole job"; git checkout -q $S
rev $S/checkpoint_outcomes.rs '    if completion.commits() {' '    if true {'; run "an intermediate savepoint commits nothing"; git checkout -q $S
rev $S/checkpoint_outcomes.rs '        actions.push(OutcomeAction::Finish);' ''; run "the final checkpoint's completion sends Finish"; git checkout -q $S
rev $S/run.rs '                        OutcomeAction::Abort(_) if !region_restart => {}' '                        OutcomeAction::Abort(_) => {}'; run "a region restart announces the aborted checkpoints to the other regions"; git checkout -q $S
rev $S/states/restarting.rs '    restart_failed(run, "deploying the restarted job", &error.to_string())' '    deploy_failed(run, error)'; run "a restart whose deploy failed goes to the restart strategy"; git checkout -q $S
rev $S/run.rs '                    master.update(|record| self.on_failure(record, Some(region), "the restart", &cause));' '                    master.update(|record| { record.failure_cause = Some(cause.clone()); master.transition_job(record, JobStatus::Failing); self.stop_tasks(); mark_canceling(record, |_| true); });'; run "a region restart whose deploy failed goes to the restart strategy"; git checkout -q $S
rev $S/states/finished.rs '    let recorded = record_result(run, terminal);' '    let recorded = Recorded::Yes;'; run "an ended job's result is recorded before it shows"; git checkout -q $S
rev $S/run.rs 'self.master.update(|record| mark_never_deployed(record, |vertex| dep.in_region(vertex, region)))' 'let _ = dep;'; run "a subtask whose attempt the executor refused ends FAILED"; git checkout -q $S
rev $S/effects.rs '        if effect.touches_tasks() && !self.leading() {' '        if false {'; run "a JobManager that lost its leadership touches no task (the io's fence)"; git checkout -q $S
rev $S/takeover.rs '    if coverage.complete {' '    if coverage.complete || coverage.reported > 0 {'; run "a new leader takes over only a complete report"; git checkout -q $S
rev $S/states/reconciling.rs '            run.send_to_all(TaskControl::CheckpointAborted(id));' '            let _ = id;'; run "a takeover aborts what the old leader left in flight"; git checkout -q $S
T=crates/weir-types/src/lifecycle.rs
rev $T 'Reconciling => matches!(next, Deploying | ' 'Reconciling => matches!(next, '; run "a subtask reported DEPLOYING is taken over"; git checkout -q $T
C=crates/weir-runtime/src/checkpointing/book.rs
rev $C '        if self.pending.values().any(|p| p.request.is_stop()) {' '        if false {'; run "no periodic checkpoint while a stop is in flight"; git checkout -q $C
rev $S/run.rs '        if self.sup.completed_stop.is_some() {
            // The stop-with-savepoint completed' '        if false {
            // The stop-with-savepoint completed'; run "no periodic checkpoint once a stop completed"; git checkout -q $S
git status --short
