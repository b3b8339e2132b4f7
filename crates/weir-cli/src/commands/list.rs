//! `weir list`: the jobs of a cluster, printed as Flink's `flink list` prints them (its
//! headings, its `dd.MM.yyyy HH:mm:ss : <id> : <name> (<STATE>)` lines), so scripts that
//! parse one parse the other.

use std::process::ExitCode;

use weir_runtime::JobOverview;
use weir_types::JobStatus;

use crate::args::ListArgs;
use crate::error::CliError;
use crate::settings;

#[derive(serde::Deserialize)]
struct Jobs {
    jobs: Vec<JobOverview>,
}

const RUNNING: &str = "------------------ Running/Restarting Jobs -------------------";
const SCHEDULED: &str = "----------------------- Scheduled Jobs -----------------------";
const TERMINATED: &str = "---------------------- Terminated Jobs -----------------------";
const END: &str = "--------------------------------------------------------------";

pub fn list(args: ListArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let client = settings::jobmanager_client(args.jobmanager.as_deref(), &config)?;
    // A `weir run` whose REST port moved off the default one is not at this address.
    for run in settings::runs_elsewhere(args.jobmanager.as_deref(), &config)? {
        eprintln!(
            "note: `weir run` (pid {}) serves job {} at {}, not here: weir list -m {}",
            run.pid,
            run.job_id,
            run.rest,
            run.rest.trim_start_matches("http://")
        );
    }
    if args.json {
        let response = client.get("/jobs/overview")?;
        if response.status != 200 {
            return Err(CliError::runtime(format!("{}/jobs/overview answered {}", client.base(), response.status)));
        }
        println!("{}", response.body.trim());
        return Ok(ExitCode::SUCCESS);
    }
    let jobs: Jobs = client.get_json("/jobs/overview")?;
    print!("{}", listing(&jobs.jobs, &args));
    Ok(ExitCode::SUCCESS)
}

/// What `weir list` prints for `jobs`. Without `-r`, `-s` or `-a`: the jobs not ended, then
/// the ended ones (a SUSPENDED job among them). With them, Flink's sections: `-r` running,
/// `-s` scheduled (CREATED or INITIALIZING), `-a` both and the terminated jobs.
fn listing(jobs: &[JobOverview], args: &ListArgs) -> String {
    let ended = |job: &&JobOverview| job.state.is_globally_terminal() || job.state == JobStatus::Suspended;
    let scheduled = |job: &&JobOverview| matches!(job.state, JobStatus::Created | JobStatus::Initializing);
    let mut out = String::new();
    if !(args.running || args.scheduled || args.all) {
        let (done, live): (Vec<&JobOverview>, Vec<&JobOverview>) = jobs.iter().partition(ended);
        section(&mut out, RUNNING, &live, Some("No running jobs."));
        section(&mut out, TERMINATED, &done, Some("No terminated jobs."));
        return out;
    }
    if args.running || args.all {
        let running: Vec<&JobOverview> = jobs.iter().filter(|job| !ended(job) && !scheduled(job)).collect();
        section(&mut out, RUNNING, &running, Some("No running jobs."));
    }
    if args.scheduled || args.all {
        let waiting: Vec<&JobOverview> = jobs.iter().filter(scheduled).collect();
        section(&mut out, SCHEDULED, &waiting, Some("No scheduled jobs."));
    }
    if args.all {
        // Flink prints nothing for an empty terminated section.
        section(&mut out, TERMINATED, &jobs.iter().filter(ended).collect::<Vec<_>>(), None);
    }
    out
}

fn section(out: &mut String, heading: &str, jobs: &[&JobOverview], empty: Option<&str>) {
    if jobs.is_empty() {
        if let Some(empty) = empty {
            out.push_str(empty);
            out.push('\n');
        }
        return;
    }
    out.push_str(heading);
    out.push('\n');
    for job in jobs {
        out.push_str(&format!("{} : {} : {} ({})\n", flink_date(job.start_time), job.jid, job.name, job.state));
    }
    out.push_str(END);
    out.push('\n');
}

/// `dd.MM.yyyy HH:mm:ss` (UTC), as `flink list` prints a job's start time.
fn flink_date(epoch_ms: u64) -> String {
    // "YYYY-MM-DD HH:MM:SS UTC"
    let utc = weir_checkpoint::inspect::format_utc(epoch_ms);
    let (date, time) = utc.split_once(' ').unwrap_or((utc.as_str(), ""));
    match date.splitn(3, '-').collect::<Vec<_>>()[..] {
        [year, month, day] => format!("{day}.{month}.{year} {}", time.trim_end_matches(" UTC")),
        _ => utc.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(jid: &str, state: JobStatus, start_time: u64) -> JobOverview {
        serde_json::from_value(serde_json::json!({
            "jid": jid, "name": "counter", "state": state, "start-time": start_time, "end-time": -1,
            "duration": 0, "last-modification": start_time, "tasks": {}
        }))
        .expect("a job overview")
    }

    fn args(flags: &[&str]) -> ListArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            list: ListArgs,
        }
        Cli::parse_from(std::iter::once("list").chain(flags.iter().copied())).list
    }

    #[test]
    fn start_times_are_printed_as_flink_list_prints_them() {
        assert_eq!(flink_date(0), "01.01.1970 00:00:00");
        assert_eq!(flink_date(1_795_974_028_000), "29.11.2026 17:40:28");
        assert_eq!(flink_date(951_782_400_000), "29.02.2000 00:00:00");
    }

    #[test]
    fn the_sections_follow_flink_list_and_its_flags() {
        let jobs = [
            job("a", JobStatus::Running, 0),
            job("b", JobStatus::Created, 0),
            job("c", JobStatus::Finished, 0),
            job("d", JobStatus::Suspended, 0),
        ];
        let default = listing(&jobs, &args(&[]));
        assert_eq!(
            default,
            format!(
                "{RUNNING}\n01.01.1970 00:00:00 : a : counter (RUNNING)\n01.01.1970 00:00:00 : b : counter (CREATED)\n{END}\n{TERMINATED}\n01.01.1970 00:00:00 : c : counter (FINISHED)\n01.01.1970 00:00:00 : d : counter (SUSPENDED)\n{END}\n"
            )
        );
        let running = listing(&jobs, &args(&["-r"]));
        assert_eq!(running, format!("{RUNNING}\n01.01.1970 00:00:00 : a : counter (RUNNING)\n{END}\n"));
        let scheduled = listing(&jobs, &args(&["--scheduled"]));
        assert_eq!(scheduled, format!("{SCHEDULED}\n01.01.1970 00:00:00 : b : counter (CREATED)\n{END}\n"));
        let all = listing(&jobs, &args(&["-a"]));
        assert!(all.starts_with(RUNNING) && all.contains(SCHEDULED) && all.contains(TERMINATED), "{all}");
        let none = listing(&[], &args(&["-a"]));
        assert_eq!(none, "No running jobs.\nNo scheduled jobs.\n", "Flink prints nothing for no terminated job");
    }
}
