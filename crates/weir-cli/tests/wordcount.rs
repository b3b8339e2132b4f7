//! `weir run wordcount` against an independent count of the same file.

mod common;

use std::collections::BTreeMap;

use common::{committed_lines, run_weir};

/// Counts words char by char: a word is a maximal run of alphanumeric characters,
/// lowercased (written independently of the job's tokenizer).
fn expected_counts(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let mut current = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_alphanumeric() {
            current.push(c);
        } else if !current.is_empty() {
            *counts.entry(current.to_lowercase()).or_insert(0) += 1;
            current.clear();
        }
    }
    counts
}

fn sample_text(lines: usize) -> String {
    let vocabulary =
        ["Weir", "flink", "STATE", "state", "Straße", "naïve", "x1", "42", "über", "checkpoint", "Ω", "日本語"];
    let separators = [" ", ", ", "  ", "—", "\t", "!", "'", "-"];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut text = String::new();
    for line in 0..lines {
        let words = (next() % 12) as usize;
        for w in 0..words {
            if w > 0 {
                text.push_str(separators[(next() % separators.len() as u64) as usize]);
            }
            text.push_str(vocabulary[(next() % vocabulary.len() as u64) as usize]);
        }
        if line % 17 == 0 {
            text.push('\r');
        }
        text.push('\n');
    }
    text
}

fn parse_counts(lines: &[String]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in lines {
        let (word, count) = line.split_once('\t').unwrap_or_else(|| panic!("not word<TAB>count: {line:?}"));
        let previous = counts.insert(word.to_string(), count.parse::<u64>().unwrap());
        assert!(previous.is_none(), "word {word} printed twice");
    }
    counts
}

#[test]
fn wordcount_to_a_directory_matches_an_independent_count_at_p1_and_p3() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.txt");
    let text = sample_text(5000);
    std::fs::write(&input, &text).unwrap();
    for p in ["1", "3"] {
        let out = dir.path().join(format!("out-{p}"));
        let output = run_weir(&[
            "run",
            "-D",
            "rest.port=0",
            "-p",
            p,
            "wordcount",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(output.status.success(), "p={p}: {}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("ended with state FINISHED"), "{stdout}");
        assert_eq!(parse_counts(&committed_lines(&out)), expected_counts(&text), "p={p}");
        // Only committed files remain: nothing in progress after FINISHED.
        for entry in std::fs::read_dir(&out).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().to_string();
            assert!(name.starts_with("part-"), "unexpected file {name}");
        }
    }
}

#[test]
fn wordcount_prints_to_stdout_with_dash() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.txt");
    std::fs::write(&input, "To be, or not to be: that is the question.\n").unwrap();
    let output =
        run_weir(&["run", "-D", "rest.port=0", "wordcount", "--input", input.to_str().unwrap(), "--output", "-"]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Stdout holds the records only; the run's own lines are on stderr.
    assert!(stdout.lines().all(|l| l.contains('\t')), "not only records on stdout:\n{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Job has been submitted with JobID ") && stderr.contains("ended with state FINISHED"),
        "{stderr}"
    );
    let lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    let counts = parse_counts(&lines);
    assert_eq!(counts.get("to"), Some(&2));
    assert_eq!(counts.get("be"), Some(&2));
    assert_eq!(counts.get("question"), Some(&1));
    assert_eq!(counts.len(), 8);
}
