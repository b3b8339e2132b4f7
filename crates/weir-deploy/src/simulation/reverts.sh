#!/usr/bin/env bash
# Shows that the deployment controller's simulation finds each bug it has a regression seed
# for: reverts each fix in turn (in the working tree, restored with git checkout after each
# run), runs the seeds and prints the first that fails. docs/simulation.md lists the
# expected seeds. Run from a clean working tree: it checks the files out again.
cd "$(dirname "$0")/../../../.."
if [ -n "$(git status --porcelain -- crates/weir-deploy/src)" ]; then
  echo "crates/weir-deploy/src has uncommitted changes; commit or stash them first (this script checks files out)" >&2
  exit 1
fi
C=crates/weir-deploy/src/controller.rs
run() { echo -n "$1: "; WEIR_DEPLOY_SIM_SEEDS=${SEEDS:-2000} WEIR_DEPLOY_SIM_SEED_BASE=${BASE:-0} cargo test -q -p weir-deploy --lib simulation::tests::a_thousand -- --nocapture 2>&1 | grep -E "^seed .* failed after|seeds from" | head -1; }
rev() { python3 -c "
import sys
p,old,new=sys.argv[1],sys.argv[2],sys.argv[3]
s=open(p).read()
assert old in s, (p, old)
open(p,'w').write(s.replace(old,new))" "$@"; }
rev $C 'status.job_status.job_id = Some(self.world.new_job_id());' 'let _ = self.world.new_job_id();'; run "the job id chosen before the submit"; git checkout -q $C
rev $C '                if view.is_none()
                    && operation.restore_from.is_none()' '                if view.is_none()
                    && false
                    && operation.restore_from.is_none()'; run "a stop's savepoint looked for when its cluster is gone"; git checkout -q $C
rev $C '            self.acting()?;
            self.backend.stop(name, seq)?;' '            self.backend.stop(name, seq)?;'; run "the leadership checked before a cluster is stopped"; git checkout -q $C
rev $C '        self.acting()?;
        let cluster = self.backend.start(name, seq, target)?;' '        let cluster = self.backend.start(name, seq, target)?;'; run "the leadership checked before a cluster is started"; git checkout -q $C
rev $C '                reconciled.job.upgrade_mode = last.job.upgrade_mode;' '                let _ = &last;'; run "a suspend's mode kept while the deployment stays suspended"; git checkout -q $C
rev $C 'left alone");
                continue;' 'left alone");'; run "a cluster newer than the operation left alone (behind the fence: not expected to be found)"; git checkout -q $C
rev $C '        if !own_checkpoint && !recovery {' '        if !recovery {'; SEEDS=10000 BASE=1000 run "an operation starting from the job's own checkpoint takes the newest once its cluster stopped"; git checkout -q $C
rev $C '        let savepoint_id_bound = chosen.as_deref().filter(|_| !own_checkpoint)' '        let savepoint_id_bound = chosen.as_deref().filter(|_| false)'; BASE=1000 run "an operation starting from the job's own savepoint takes a newer checkpoint once its cluster stopped"; git checkout -q $C
git status --short
