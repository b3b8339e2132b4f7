//! `weir list`: the jobs of a cluster, grouped like Flink's `flink list`.

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

pub fn list(args: ListArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let client = settings::jobmanager_client(args.jobmanager.as_deref(), &config)?;
    if args.json {
        let response = client.get("/jobs/overview")?;
        if response.status != 200 {
            return Err(CliError::runtime(format!("{}/jobs/overview answered {}", client.base(), response.status)));
        }
        println!("{}", response.body.trim());
        return Ok(ExitCode::SUCCESS);
    }
    let jobs: Jobs = client.get_json("/jobs/overview")?;
    let (live, ended): (Vec<&JobOverview>, Vec<&JobOverview>) =
        jobs.jobs.iter().partition(|j| !j.state.is_globally_terminal() && j.state != JobStatus::Suspended);
    print_section("Running/Restarting Jobs", &live, "No running jobs.");
    print_section("Terminated Jobs", &ended, "No terminated jobs.");
    Ok(ExitCode::SUCCESS)
}

fn print_section(title: &str, jobs: &[&JobOverview], empty: &str) {
    if jobs.is_empty() {
        println!("{empty}");
        return;
    }
    println!("------------------ {title} -------------------");
    for job in jobs {
        println!("{} : {} : {} ({})", format_utc(job.start_time), job.jid, job.name, job.state);
    }
    println!("--------------------------------------------------------------");
}

/// `YYYY-MM-DD HH:MM:SS UTC` from epoch milliseconds (civil-from-days, proleptic Gregorian).
fn format_utc(epoch_ms: u64) -> String {
    let secs = epoch_ms / 1000;
    let days = (secs / 86_400) as i64;
    let time = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", time / 3600, time % 3600 / 60, time % 60)
}

#[cfg(test)]
mod tests {
    use super::format_utc;

    #[test]
    fn formats_epoch_milliseconds_as_utc() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(1_795_974_028_000), "2026-11-29 17:40:28 UTC");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
