//! A readable (or JSON) report of a snapshot's metadata, for `weir savepoint inspect PATH`.
//!
//! Sizes are state bytes: the sum of the blocks' lengths (data-file headers and `_metadata`
//! itself are not counted).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::format::{BlockRef, OperatorSnapshot, SnapshotMetadata};

/// Formats epoch milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn format_utc(timestamp_ms: u64) -> String {
    let seconds = timestamp_ms / 1000;
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", of_day / 3600, of_day % 3600 / 60, of_day % 60)
}

/// The proleptic Gregorian date of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `1536 bytes (1.5 KiB)`.
fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{bytes} bytes ({value:.1} {})", UNITS[unit])
}

/// (bytes, entries) of blocks; saturating, as a crafted snapshot may record any lengths.
/// A key group whose blocks are a chain (a full block and entry deltas) counts the entries
/// of its last block only: each block records the group's entries after it.
fn sum<'a>(blocks: impl IntoIterator<Item = &'a BlockRef>) -> (u64, u64) {
    let blocks: Vec<&BlockRef> = blocks.into_iter().collect();
    blocks.iter().enumerate().fold((0, 0), |(bytes, entries), (index, block)| {
        let superseded = blocks.get(index + 1).is_some_and(|next| next.delta);
        let counted = if superseded { 0 } else { block.entries };
        (bytes.saturating_add(block.length), entries.saturating_add(counted))
    })
}

/// One operator's report: its states (per name, in first-appearance order, summed over
/// subtasks) and its subtasks.
fn operator_summary(operator: &OperatorSnapshot) -> Value {
    let mut keyed: Vec<(String, String, String, Vec<BlockRef>)> = Vec::new();
    let mut states: Vec<(String, String, Vec<BlockRef>)> = Vec::new();
    for subtask in &operator.subtasks {
        for state in &subtask.keyed_states {
            match keyed.iter_mut().find(|(name, ..)| *name == state.name) {
                Some(entry) => entry.3.extend(&state.key_groups),
                None => keyed.push((
                    state.name.clone(),
                    state.kind.clone(),
                    state.value_type.clone(),
                    state.key_groups.clone(),
                )),
            }
        }
        for state in &subtask.operator_states {
            match states.iter_mut().find(|(name, ..)| *name == state.name) {
                Some(entry) => entry.2.extend(&state.elements),
                None => states.push((state.name.clone(), state.mode.to_string(), state.elements.clone())),
            }
        }
    }
    let keyed_json: Vec<Value> = keyed
        .iter()
        .map(|(name, kind, value_type, blocks)| {
            let (bytes, entries) = sum(blocks);
            let deltas = blocks.iter().filter(|block| block.delta).count();
            let mut state = json!({"name": name, "kind": kind, "value_type": value_type,
                   "key_groups": blocks.len() - deltas, "entries": entries, "bytes": bytes});
            if deltas > 0 {
                // Incremental checkpoints: blocks that are entry deltas of a key group.
                state["entry_deltas"] = json!(deltas);
            }
            state
        })
        .collect();
    let states_json: Vec<Value> = states
        .iter()
        .map(|(name, mode, blocks)| {
            let (bytes, entries) = sum(blocks);
            json!({"name": name, "mode": mode, "elements": blocks.len(), "entries": entries, "bytes": bytes})
        })
        .collect();
    let subtasks_json: Vec<Value> = operator
        .subtasks
        .iter()
        .map(|subtask| {
            let blocks = subtask
                .keyed_states
                .iter()
                .flat_map(|state| &state.key_groups)
                .chain(subtask.operator_states.iter().flat_map(|state| &state.elements));
            let (bytes, entries) = sum(blocks);
            json!({
                "subtask": subtask.subtask,
                "key_group_range": subtask.key_group_range.map(|range| json!({"start": range.start, "end": range.end})),
                "file": subtask.file,
                "bytes": bytes,
                "entries": entries,
                "finished": subtask.finished,
            })
        })
        .collect();
    let total = subtasks_json.iter().filter_map(|subtask| subtask["bytes"].as_u64()).fold(0u64, u64::saturating_add);
    json!({
        "uid": operator.uid,
        "name": operator.name,
        "parallelism": operator.parallelism,
        "key_type": operator.key_type,
        "finished_subtasks": operator.subtasks.iter().filter(|subtask| subtask.finished).count(),
        "bytes": total,
        "keyed_states": keyed_json,
        "operator_states": states_json,
        "subtasks": subtasks_json,
    })
}

/// The report as JSON: the snapshot's header fields, total bytes, and per operator its
/// states (with entries and bytes summed over subtasks) and subtasks.
pub fn inspect_json(metadata: &SnapshotMetadata, location: &str) -> Value {
    let operators: Vec<Value> = metadata.operators.iter().map(operator_summary).collect();
    let total = operators.iter().filter_map(|operator| operator["bytes"].as_u64()).fold(0u64, u64::saturating_add);
    json!({
        "location": location,
        "kind": metadata.kind,
        "format_version": metadata.format_version,
        "format": metadata.format.as_str(),
        "state_backend": metadata.backend(),
        "job_id": metadata.job_id,
        "job_name": metadata.job_name,
        "checkpoint_id": metadata.checkpoint_id,
        "timestamp_ms": metadata.timestamp_ms,
        "time": format_utc(metadata.timestamp_ms),
        "max_parallelism": metadata.max_parallelism,
        "bytes": total,
        "operators": operators,
    })
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or_default()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// The report as text, one fact per line.
pub fn inspect_text(metadata: &SnapshotMetadata, location: &str) -> String {
    let report = inspect_json(metadata, location);
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(out, "Snapshot {location}");
    let _ = writeln!(out, "  kind:             {}", metadata.kind);
    let _ = writeln!(out, "  job:              {} ({})", metadata.job_id, metadata.job_name);
    let _ = writeln!(out, "  checkpoint id:    {}", metadata.checkpoint_id);
    let _ = writeln!(out, "  taken:            {}", format_utc(metadata.timestamp_ms));
    let _ = writeln!(out, "  max parallelism:  {}", metadata.max_parallelism);
    let _ = writeln!(out, "  format version:   {}", metadata.format_version);
    let portable =
        if metadata.format.is_canonical() { "any state backend restores it" } else { "only that backend restores it" };
    let _ = writeln!(
        out,
        "  format:           {} (written by the {} state backend; {portable})",
        metadata.format.as_str().to_lowercase(),
        metadata.backend()
    );
    let shared = crate::dispose::shared_files_of(metadata);
    if !shared.is_empty() {
        let own = shared
            .iter()
            .filter(|name| crate::paths::shared_file_checkpoint(name) == Some(metadata.checkpoint_id))
            .count();
        let _ = writeln!(
            out,
            "  incremental:      blocks in {} files of ../shared/ ({own} written by this checkpoint, {} by older ones); move or copy the job's whole directory, not this one alone",
            shared.len(),
            shared.len() - own
        );
    }
    let _ = writeln!(out, "  state size:       {}", format_bytes(number(&report["bytes"])));
    let _ = writeln!(out, "  operators:        {}", metadata.operators.len());
    for operator in report["operators"].as_array().into_iter().flatten() {
        let keyed = match operator["key_type"].as_str() {
            Some(key_type) => format!("key type {key_type}"),
            None => "not keyed".to_string(),
        };
        let finished = match (number(&operator["finished_subtasks"]), number(&operator["parallelism"])) {
            (0, _) => String::new(),
            (done, all) if done == all => ", finished (its input had ended)".to_string(),
            (done, all) => format!(", {done} of {all} subtasks finished"),
        };
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Operator '{}' ({}): parallelism {}, {keyed}, {}{finished}",
            text(&operator["uid"]),
            text(&operator["name"]),
            number(&operator["parallelism"]),
            format_bytes(number(&operator["bytes"]))
        );
        let keyed_states = operator["keyed_states"].as_array().map_or(&[][..], Vec::as_slice);
        let operator_states = operator["operator_states"].as_array().map_or(&[][..], Vec::as_slice);
        if keyed_states.is_empty() && operator_states.is_empty() {
            let _ = writeln!(out, "  no state");
            continue;
        }
        for state in keyed_states {
            let _ = writeln!(
                out,
                "  keyed state '{}': {} of {}, {} in {}, {}",
                text(&state["name"]),
                text(&state["kind"]),
                text(&state["value_type"]),
                counted(number(&state["entries"]), "entry", "entries"),
                counted(number(&state["key_groups"]), "key group", "key groups"),
                format_bytes(number(&state["bytes"]))
            );
        }
        for state in operator_states {
            let _ = writeln!(
                out,
                "  operator state '{}' ({}): {}, {}, {}",
                text(&state["name"]),
                text(&state["mode"]),
                counted(number(&state["elements"]), "element", "elements"),
                counted(number(&state["entries"]), "entry", "entries"),
                format_bytes(number(&state["bytes"]))
            );
        }
        for subtask in operator["subtasks"].as_array().into_iter().flatten() {
            let range = &subtask["key_group_range"];
            let groups = if range.is_null() {
                String::new()
            } else {
                format!("key groups {}..={}, ", number(&range["start"]), number(&range["end"]))
            };
            let file = subtask["file"].as_str().map(|file| format!(", file {file}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "  subtask {}: {groups}{}, {}{file}",
                number(&subtask["subtask"]),
                format_bytes(number(&subtask["bytes"])),
                counted(number(&subtask["entries"]), "entry", "entries")
            );
        }
    }
    out
}

/// `1 entry`, `2 entries`.
fn counted(n: u64, one: &str, many: &str) -> String {
    if n == 1 { format!("1 {one}") } else { format!("{n} {many}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{SnapshotSpec, build_snapshot};

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_utc(1_700_000_000_123), "2023-11-14 22:13:20 UTC");
        assert_eq!(format_utc(4_102_444_799_000), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn byte_formatting() {
        assert_eq!(format_bytes(12), "12 bytes");
        assert_eq!(format_bytes(1536), "1536 bytes (1.5 KiB)");
        assert_eq!(format_bytes(3 * 1024 * 1024), "3145728 bytes (3.0 MiB)");
    }

    #[test]
    fn report_covers_every_operator_state_and_subtask() {
        let (metadata, _) = build_snapshot(&SnapshotSpec::sample());
        let location = "/tmp/sp/savepoint-012345-abcdefabcdef";
        let report = inspect_json(&metadata, location);
        assert_eq!(report["kind"], "savepoint");
        assert_eq!(report["max_parallelism"], 8);
        assert_eq!(report["time"], "2023-11-14 22:13:20 UTC");
        let counter = &report["operators"][1];
        assert_eq!(counter["uid"], "counter");
        assert_eq!(counter["keyed_states"][0]["key_groups"], 8);
        assert_eq!(counter["subtasks"][1]["key_group_range"]["start"], 4);
        let block_bytes: u64 = metadata
            .operators
            .iter()
            .flat_map(|operator| &operator.subtasks)
            .flat_map(|subtask| {
                subtask
                    .keyed_states
                    .iter()
                    .flat_map(|state| &state.key_groups)
                    .chain(subtask.operator_states.iter().flat_map(|state| &state.elements))
            })
            .map(|block| block.length)
            .sum();
        assert_eq!(report["bytes"], block_bytes);

        let text = inspect_text(&metadata, location);
        for expected in [
            location,
            "kind:             savepoint",
            "taken:            2023-11-14 22:13:20 UTC",
            "max parallelism:  8",
            "format:           canonical (written by the hashmap state backend; any state backend restores it)",
            "Operator 'counter' (Operator counter): parallelism 2, key type u64",
            "keyed state 'state-0': value of i64",
            "in 8 key groups",
            "subtask 1: key groups 4..=7, ",
            "operator state 'split-state' (split)",
            "operator state 'broadcast-state' (broadcast)",
            "Operator 'sink' (Operator sink): parallelism 1, not keyed, 0 bytes\n  no state",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
