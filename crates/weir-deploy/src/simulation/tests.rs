//! The deployment simulation's seeds: many per run, and a replay of one with its whole trace.

use super::{Report, run};

/// Seeds per test run (`WEIR_DEPLOY_SIM_SEEDS` overrides), from `WEIR_DEPLOY_SIM_SEED_BASE`.
const SEEDS: u64 = 1_000;

/// Seeds that find a bug when its fix is reverted (crates/weir-deploy/src/simulation/reverts.sh;
/// docs/simulation.md names each):
/// - 35: the new job's id is not chosen and recorded before it is submitted, so a job a
///   controller submitted and never heard back from is unknown once its cluster dies, and
///   the next upgrade restores the job before it;
/// - 757: a stop-with-savepoint that completed (and committed) while its cluster went away
///   is not looked for, and the new job starts from an older checkpoint;
/// - 258: a suspended deployment's next pass records the spec's mode over the one its
///   suspend used, and the resume starts empty;
/// - 260: a cluster is stopped without the leadership checked first (an operator woken
///   after its successor took over stops a cluster);
/// - 126: a cluster is started without the leadership checked first (the deployment's
///   deletion then leaves it running too);
/// - 10771: an operation that chose the job's newest checkpoint while its HA JobManager was
///   down starts from it although the JobManager came back and completed (and committed)
///   newer ones before the cluster was stopped;
/// - 1507: the same after a stop's savepoint: the JobManager died before the job finished,
///   came back, restored the savepoint and ran on past it.
const REGRESSION_SEEDS: &[u64] = &[35, 126, 258, 260, 757, 1507, 10771];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|value| value.trim().parse().ok())
}

fn failure_text(report: &Report) -> String {
    let tail: Vec<&str> = report.trace.iter().rev().take(200).map(String::as_str).collect::<Vec<_>>();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!(
        "seed {} failed after {} steps: {}\n--- the last steps of its trace ---\n{}\n--- replay it with:\nWEIR_SIM_SEED={} cargo test -p weir-deploy --lib simulation::tests::replay -- --ignored --nocapture",
        report.seed,
        report.steps,
        report.violations.join("; "),
        tail.join("\n"),
        report.seed
    )
}

#[test]
fn a_thousand_seeds_of_two_operators_keep_every_invariant() {
    let count = env_u64("WEIR_DEPLOY_SIM_SEEDS").unwrap_or(SEEDS);
    let base = env_u64("WEIR_DEPLOY_SIM_SEED_BASE").unwrap_or(0);
    let started = std::time::Instant::now();
    let (mut steps, mut generations, mut elections) = (0, 0, 0);
    let (mut deleted, mut manual_savepoints, mut revived) = (0, 0, 0);
    for seed in base..base + count {
        let report = run(seed);
        if !report.violations.is_empty() {
            panic!("{}", failure_text(&report));
        }
        steps += report.steps;
        generations += report.generations;
        elections += report.elections;
        deleted += report.trace.iter().filter(|line| line.contains("the store forgets")).count();
        manual_savepoints += report.trace.iter().filter(|line| line.contains("MANUAL savepoint")).count();
        revived += report.trace.iter().filter(|line| line.contains("is back (HA)")).count();
    }
    eprintln!(
        "{count} seeds from {base}: {steps} steps, {generations} generations applied, {elections} elections, \
         {deleted} deployments deleted, {manual_savepoints} manual savepoints, {revived} JobManagers back (HA), {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn the_regression_seeds_keep_every_invariant() {
    for seed in REGRESSION_SEEDS {
        let report = run(*seed);
        assert!(report.violations.is_empty(), "{}", failure_text(&report));
    }
}

#[test]
fn a_seed_runs_the_same_twice() {
    let (first, second) = (run(7), run(7));
    assert_eq!(first.trace, second.trace);
}

#[test]
#[ignore = "replays one seed: WEIR_SIM_SEED=<seed>"]
fn replay() {
    let seed = env_u64("WEIR_SIM_SEED").unwrap_or(0);
    let report = run(seed);
    for line in &report.trace {
        println!("{line}");
    }
    assert!(report.violations.is_empty(), "{}", failure_text(&report));
}
