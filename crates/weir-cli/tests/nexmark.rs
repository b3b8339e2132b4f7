//! The Nexmark queries through the real binary, each checked against an independent
//! computation over the same generated events; then the windowed queries through a
//! stop-with-savepoint in the middle of open windows and a restore at another parallelism,
//! and through `kill -9` and a restore from the newest checkpoint: the output is identical to
//! an uninterrupted run, exactly once.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{RunningWeir, committed_lines, newest_checkpoint, poll_json, run_weir, savepoint_location};
use weir_jobs::nexmark::{Auction, Bid, Event, Person, generate};

const EVENTS: u64 = 200_000;

fn events(n: u64) -> Vec<Event> {
    (0..n).map(generate).collect()
}

fn bids(events: &[Event]) -> impl Iterator<Item = &Bid> {
    events.iter().filter_map(|e| if let Event::Bid(b) = e { Some(b) } else { None })
}

fn persons(events: &[Event]) -> impl Iterator<Item = &Person> {
    events.iter().filter_map(|e| if let Event::Person(p) = e { Some(p) } else { None })
}

fn auctions(events: &[Event]) -> impl Iterator<Item = &Auction> {
    events.iter().filter_map(|e| if let Event::Auction(a) = e { Some(a) } else { None })
}

/// What each query must output for `events`, sorted (q4: the final line per category).
fn expected(query: &str, events: &[Event]) -> Vec<String> {
    let mut lines: Vec<String> = match query {
        "q0" => bids(events).map(|b| format!("{}\t{}\t{}\t{}", b.auction, b.bidder, b.price, b.date_time)).collect(),
        "q1" => bids(events)
            .map(|b| format!("{}\t{}\t{}\t{}", b.auction, b.bidder, b.price * 908 / 1000, b.date_time))
            .collect(),
        "q2" => bids(events).filter(|b| b.auction % 123 == 0).map(|b| format!("{}\t{}", b.auction, b.price)).collect(),
        "q3" => {
            let people: BTreeMap<u64, &Person> =
                persons(events).filter(|p| ["OR", "ID", "CA"].contains(&p.state.as_ref())).map(|p| (p.id, p)).collect();
            auctions(events)
                .filter(|a| a.category == 10)
                .filter_map(|a| people.get(&a.seller).map(|p| format!("{}\t{}\t{}\t{}", p.name, p.city, p.state, a.id)))
                .collect()
        }
        "q4" => {
            let mut best: BTreeMap<u64, u64> = BTreeMap::new();
            let by_id: BTreeMap<u64, &Auction> = auctions(events).map(|a| (a.id, a)).collect();
            for b in bids(events) {
                let a = by_id[&b.auction];
                if a.date_time <= b.date_time && b.date_time <= a.expires {
                    let price = best.entry(a.id).or_insert(b.price);
                    *price = (*price).max(b.price);
                }
            }
            let mut per_category: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            for (id, price) in best {
                let totals = per_category.entry(by_id[&id].category).or_default();
                totals.0 += price;
                totals.1 += 1;
            }
            per_category.iter().map(|(c, (sum, count))| format!("{c}\t{count}\t{}", sum / count)).collect()
        }
        "q5" => {
            let mut counts: BTreeMap<(i64, u64), u64> = BTreeMap::new();
            for b in bids(events) {
                let last_start = b.date_time - b.date_time.rem_euclid(2_000);
                let mut start = last_start;
                while start > b.date_time - 10_000 {
                    *counts.entry((start + 10_000, b.auction)).or_default() += 1;
                    start -= 2_000;
                }
            }
            let mut max: BTreeMap<i64, u64> = BTreeMap::new();
            for ((end, _), count) in &counts {
                let m = max.entry(*end).or_default();
                *m = (*m).max(*count);
            }
            counts
                .iter()
                .filter(|((end, _), count)| max[end] == **count)
                .map(|((end, auction), count)| format!("{end}\t{auction}\t{count}"))
                .collect()
        }
        "q7" => {
            let end_of = |t: i64| t - t.rem_euclid(10_000) + 10_000;
            let mut max: BTreeMap<i64, u64> = BTreeMap::new();
            for b in bids(events) {
                let m = max.entry(end_of(b.date_time)).or_default();
                *m = (*m).max(b.price);
            }
            bids(events)
                .filter(|b| max[&end_of(b.date_time)] == b.price)
                .map(|b| format!("{}\t{}\t{}\t{}\t{}", end_of(b.date_time), b.auction, b.price, b.bidder, b.date_time))
                .collect()
        }
        "q8" => {
            let start_of = |t: i64| t - t.rem_euclid(10_000);
            let sellers: BTreeSet<(u64, i64)> = auctions(events).map(|a| (a.seller, start_of(a.date_time))).collect();
            persons(events)
                .filter(|p| sellers.contains(&(p.id, start_of(p.date_time))))
                .map(|p| format!("{}\t{}\t{}", p.id, p.name, start_of(p.date_time)))
                .collect()
        }
        "q11" => {
            let mut times: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
            for b in bids(events) {
                times.entry(b.bidder).or_default().push(b.date_time);
            }
            let mut lines = Vec::new();
            for (bidder, mut at) in times {
                at.sort_unstable();
                let (mut start, mut last, mut count) = (at[0], at[0], 0u64);
                for t in at {
                    if t - last > 10_000 {
                        lines.push(format!("{bidder}\t{count}\t{start}\t{}", last + 10_000));
                        (start, count) = (t, 0);
                    }
                    last = t;
                    count += 1;
                }
                lines.push(format!("{bidder}\t{count}\t{start}\t{}", last + 10_000));
            }
            lines
        }
        other => panic!("no reference for {other}"),
    };
    lines.sort();
    lines
}

/// q4 writes a running average: keep each category's last (highest-count) line.
fn final_q4_lines(lines: Vec<String>) -> Vec<String> {
    let mut last: BTreeMap<u64, (u64, String)> = BTreeMap::new();
    for line in lines {
        let fields: Vec<&str> = line.split('\t').collect();
        let (category, count): (u64, u64) = (fields[0].parse().unwrap(), fields[1].parse().unwrap());
        if last.get(&category).is_none_or(|(c, _)| count > *c) {
            last.insert(category, (count, line.clone()));
        }
    }
    last.into_values().map(|(_, line)| line).collect()
}

fn sorted_output(query: &str, dir: &std::path::Path) -> Vec<String> {
    let mut lines = committed_lines(dir);
    if query == "q4" {
        lines = final_q4_lines(lines);
    }
    lines.sort();
    lines
}

#[test]
fn every_query_matches_an_independent_computation() {
    let all = events(EVENTS);
    let events_arg = EVENTS.to_string();
    for query in ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let output = run_weir(&[
            "run",
            "-p",
            "2",
            "nexmark",
            "--query",
            query,
            "--events",
            &events_arg,
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(output.status.success(), "{query}: {}", String::from_utf8_lossy(&output.stderr));
        let expected = expected(query, &all);
        assert!(!expected.is_empty(), "{query}: the reference is empty; the test would prove nothing");
        let seen = sorted_output(query, &out);
        assert_eq!(seen.len(), expected.len(), "{query}: line count");
        assert_eq!(seen, expected, "{query}");
    }
}

#[test]
fn an_unknown_query_names_the_ones_weir_runs() {
    let output = run_weir(&["run", "nexmark", "--query", "q6", "--events", "10"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("q6") && stderr.contains("q0, q1, q2, q3, q4, q5, q7, q8, q11"), "{stderr}");
}

/// Stops `query` with a savepoint while its windows are open, restores at parallelism 3
/// into the same output, and compares with the reference: exactly once, as if uninterrupted.
fn stop_and_restore(query: &str) {
    let all = events(EVENTS);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let savepoints = dir.path().join("savepoints");
    let events_arg = EVENTS.to_string();
    let args = |p: &'static str| -> Vec<String> {
        [
            "run",
            "-p",
            p,
            "-D",
            "rest.port=0",
            "-D",
            "execution.checkpointing.interval=300ms",
            "nexmark",
            "--query",
            query,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--events".into(), events_arg.clone(), "--rate".into(), "60000".into()])
        .chain(["--output".into(), out.to_str().unwrap().to_string()])
        .collect()
    };
    let first: Vec<String> = args("2");
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let mut weir = RunningWeir::start(&first);
    let rest = weir.rest_url();
    let job = weir.job_id();
    poll_json(&format!("{rest}/jobs/{job}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(2));
    let stop = run_weir(&["stop", "-m", &rest, "--savepoint-path", savepoints.to_str().unwrap(), &job]);
    assert!(stop.status.success(), "{}", String::from_utf8_lossy(&stop.stderr));
    let location = savepoint_location(&String::from_utf8_lossy(&stop.stdout));
    weir.wait();
    let partial = committed_lines(&out).len();
    let second: Vec<String> = args("3");
    let mut second: Vec<&str> = second.iter().map(String::as_str).collect();
    second.splice(1..1, ["-s", location.as_str()]);
    let output = run_weir(&second);
    assert!(output.status.success(), "{query}: {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        sorted_output(query, &out),
        expected(query, &all),
        "{query}: after a stop at {partial} lines and a restore at p=3"
    );
}

#[test]
fn windows_open_at_a_stop_with_savepoint_continue_exactly_once_at_another_parallelism() {
    for query in ["q5", "q7", "q11"] {
        stop_and_restore(query);
    }
}

#[test]
fn a_windowed_query_killed_hard_restores_from_its_checkpoint_exactly_once() {
    for query in ["q4", "q8"] {
        let all = events(EVENTS);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let chk = dir.path().join("chk");
        let checkpoints = format!("state.checkpoints.dir=file://{}", chk.display());
        let events_arg = EVENTS.to_string();
        let out_arg = out.to_str().unwrap().to_string();
        let base = [
            "-D",
            "rest.port=0",
            "-D",
            "execution.checkpointing.interval=200ms",
            "-D",
            &checkpoints,
            "nexmark",
            "--query",
            query,
            "--events",
            &events_arg,
            "--rate",
            "60000",
            "--output",
            &out_arg,
        ];
        let mut first = vec!["run", "-p", "2"];
        first.extend(base);
        let mut weir = RunningWeir::start(&first);
        let rest = weir.rest_url();
        let job = weir.job_id();
        poll_json(&format!("{rest}/jobs/{job}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(3));
        weir.kill_hard();
        let newest = newest_checkpoint(&chk.join(&job)).expect("a retained checkpoint");
        let mut second = vec!["run", "-p", "1", "-s", newest.to_str().unwrap()];
        second.extend(base);
        let output = run_weir(&second);
        assert!(output.status.success(), "{query}: {}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(sorted_output(query, &out), expected(query, &all), "{query}: after kill -9 and a restore at p=1");
    }
}

#[test]
fn watermarks_show_in_rest_in_flinks_shape_and_in_metrics() {
    let mut weir = RunningWeir::start(&[
        "run",
        "-p",
        "2",
        "-D",
        "rest.port=0",
        "nexmark",
        "--query",
        "q5",
        "--rate",
        "20000",
        "--output",
        "none",
    ]);
    let rest = weir.rest_url();
    let job = weir.job_id();
    let details = poll_json(&format!("{rest}/jobs/{job}"), |d| d["state"] == "RUNNING");
    let window = details["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str().unwrap_or_default().contains("Window"))
        .expect("a window vertex")["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Flink's shape: [{"id": "<subtask>.currentInputWatermark", "value": "<epoch ms>"}].
    let watermarks = poll_json(&format!("{rest}/jobs/{job}/vertices/{window}/watermarks"), |w| {
        w.as_array().is_some_and(|all| {
            all.len() == 2
                && all.iter().all(|m| {
                    m["value"].as_str().and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > 1_700_000_000_000)
                })
        })
    });
    assert_eq!(watermarks[0]["id"], "0.currentInputWatermark", "{watermarks}");
    assert_eq!(watermarks[1]["id"], "1.currentInputWatermark", "{watermarks}");
    let metrics = common::get(&format!("{rest}/metrics")).body;
    assert!(metrics.contains("weir_task_current_input_watermark{"), "{metrics}");
    weir.kill_hard();
}
