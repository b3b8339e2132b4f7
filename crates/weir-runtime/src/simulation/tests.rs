//! The simulation's seeds: many per run, the regression seeds of bugs it found, and a replay
//! of one seed with its whole trace.

use super::{Report, run};

/// Seeds per test run (`WEIR_SIM_SEEDS` overrides), from `WEIR_SIM_SEED_BASE` (default 0).
const SEEDS: u64 = 10_000;

/// Seeds that find a bug when its fix is reverted, kept as regression tests; docs/simulation.md
/// names the fix each one breaks:
/// - 54: an intermediate savepoint commits (`Completion::commits`);
/// - 2: checkpoint ids are used before the HA store's counter is past them;
/// - 6: a checkpoint whose HA pointer write got no answer is deleted, or a completion's pointer
///   write does not drop the checkpoints it subsumes;
/// - 6985, 604: a checkpoint whose pointer write got no answer has its files released, or is
///   restored here (`Retention::keep_uncertain`; the first is the code as it was, found by
///   the simulation);
/// - 2720: while such a write is unsettled a restart restores the leader's own newest
///   checkpoint, not the HA store's (`CheckpointCoordinator::restart_point`);
/// - 154: a checkpoint naming a released shared file completes (`Retention::may_name`).
const REGRESSION_SEEDS: &[u64] = &[2, 6, 54, 154, 604, 2720, 6985];

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
fn run_all(seeds: Vec<u64>) -> (Option<Report>, u64, u64) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let chunks: Vec<Vec<u64>> =
        (0..threads).map(|t| seeds.iter().copied().skip(t).step_by(threads).collect()).collect();
    let results: Vec<(Option<Report>, u64, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    let (mut steps, mut checkpoints) = (0, 0);
                    for seed in chunk {
                        let report = run(seed);
                        steps += report.steps as u64;
                        checkpoints += report.checkpoints;
                        if !report.violations.is_empty() {
                            return (Some(report), steps, checkpoints);
                        }
                    }
                    (None, steps, checkpoints)
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap_or((None, 0, 0))).collect()
    });
    let steps = results.iter().map(|r| r.1).sum();
    let checkpoints = results.iter().map(|r| r.2).sum();
    let failure = results.into_iter().find_map(|r| r.0);
    (failure, steps, checkpoints)
}

#[test]
fn ten_thousand_seeds_keep_every_invariant() {
    let count = env_u64("WEIR_SIM_SEEDS").unwrap_or(SEEDS);
    let base = env_u64("WEIR_SIM_SEED_BASE").unwrap_or(0);
    let started = std::time::Instant::now();
    let (failure, steps, checkpoints) = run_all((base..base + count).collect());
    if let Some(report) = failure {
        panic!("{}", failure_text(&report));
    }
    eprintln!(
        "{count} seeds from {base}: {steps} steps, {checkpoints} checkpoint ids, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn the_regression_seeds_keep_every_invariant() {
    let (failure, _, _) = run_all(REGRESSION_SEEDS.to_vec());
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
