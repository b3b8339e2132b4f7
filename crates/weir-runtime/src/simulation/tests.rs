//! The simulation's seeds: many per run, the regression seeds of bugs it found, and a replay
//! of one seed with its whole trace.

use super::{Report, run};

/// Seeds per test run (`WEIR_SIM_SEEDS` overrides), from `WEIR_SIM_SEED_BASE` (default 0).
const SEEDS: u64 = 10_000;

/// Seeds that find a bug when its fix is reverted, kept as regression tests; docs/simulation.md
/// names the fix each one breaks (found again on 2026-12-06, after the slot ledger and
/// RECONCILING's rules came into the simulation and changed every run):
/// - 108: an intermediate savepoint commits (`Completion::commits`);
/// - 4: checkpoint ids are used before the HA store's counter is past them;
/// - 32: a checkpoint whose HA pointer write got no answer has its files deleted;
/// - 6758: such a checkpoint's files are not protected (the code as it was);
/// - 126: such a checkpoint is restored here;
/// - 6: a completion's pointer write does not drop the checkpoints it subsumes;
/// - 26: a checkpoint naming a released shared file completes (`Retention::may_name`);
/// - 0: a stop-with-savepoint is no restart point (its sinks commit, then the job ends short);
/// - 60: a stop's savepoint is deleted once a later checkpoint subsumes it;
/// - 8989: a TaskManager counted lost leaves its slots held by the jobs that used them;
/// - 2: a settled job's reported attempts stay reported and keep their slots.
const REGRESSION_SEEDS: &[u64] = &[0, 2, 4, 6, 26, 32, 60, 108, 126, 6758, 8989];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|value| value.trim().parse().ok())
}

fn failure_text(report: &Report) -> String {
    let tail: Vec<&String> = report.trace.iter().rev().take(150).collect();
    let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
    format!(
        "seed {} failed after {} steps: {}\n--- the last steps of its trace ---\n{}\n--- replay it with:\nWEIR_SIM_SEED={} cargo test -p weir-runtime --lib simulation::tests::replay -- --ignored --nocapture",
        report.seed,
        report.steps,
        report.violations.join("; "),
        tail.join("\n"),
        report.seed
    )
}

/// Runs `seeds` over the machine's cores; the first failure, if any.
fn run_all(seeds: Vec<u64>) -> (Option<Report>, Totals) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let chunks: Vec<Vec<u64>> =
        (0..threads).map(|t| seeds.iter().copied().skip(t).step_by(threads).collect()).collect();
    let results: Vec<(Option<Report>, Totals)> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    let mut totals = Totals::default();
                    for seed in chunk {
                        let report = run(seed);
                        totals.steps += report.steps as u64;
                        totals.checkpoints += report.checkpoints;
                        totals.failed_jobs += report.failed_jobs;
                        if !report.violations.is_empty() {
                            return (Some(report), totals);
                        }
                    }
                    (None, totals)
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap_or_default()).collect()
    });
    let mut totals = Totals::default();
    for (_, part) in &results {
        totals.steps += part.steps;
        totals.checkpoints += part.checkpoints;
        totals.failed_jobs += part.failed_jobs;
    }
    let failure = results.into_iter().find_map(|r| r.0);
    (failure, totals)
}

/// What a set of seeds came to.
#[derive(Default)]
struct Totals {
    steps: u64,
    checkpoints: u64,
    failed_jobs: u64,
}

#[test]
fn ten_thousand_seeds_keep_every_invariant() {
    let count = env_u64("WEIR_SIM_SEEDS").unwrap_or(SEEDS);
    let base = env_u64("WEIR_SIM_SEED_BASE").unwrap_or(0);
    let started = std::time::Instant::now();
    let (failure, totals) = run_all((base..base + count).collect());
    if let Some(report) = failure {
        panic!("{}", failure_text(&report));
    }
    let Totals { steps, checkpoints, failed_jobs } = totals;
    eprintln!(
        "{count} seeds from {base}: {steps} steps, {checkpoints} checkpoint ids, {failed_jobs} jobs FAILED and resubmitted, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn the_regression_seeds_keep_every_invariant() {
    let (failure, _) = run_all(REGRESSION_SEEDS.to_vec());
    if let Some(report) = failure {
        panic!("{}", failure_text(&report));
    }
}

#[test]
fn a_seed_replays_the_same_run() {
    let first = run(42);
    let second = run(42);
    assert_eq!(first.trace, second.trace, "one seed, one run");
    assert!(first.finished && first.violations.is_empty(), "{}", failure_text(&first));
}

/// `WEIR_SIM_SEED=<seed>`: runs that seed and prints its whole trace.
#[test]
#[ignore = "a tool: replays the seed WEIR_SIM_SEED names (run with --ignored)"]
fn replay() {
    let Some(seed) = env_u64("WEIR_SIM_SEED") else {
        panic!("set WEIR_SIM_SEED to the seed to replay (a failing run prints it)");
    };
    let report = run(seed);
    for line in &report.trace {
        println!("{line}");
    }
    assert!(report.violations.is_empty(), "{}", failure_text(&report));
}
