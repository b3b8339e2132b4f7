//! `weir kafka topics | create | produce | consume`: Kafka's console tools for a job's
//! topics, so that a user with the installed binary and a broker needs nothing else.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;

use weir_connectors::kafka::tools;

use crate::args::KafkaCommand;
use crate::error::CliError;

pub fn kafka(command: KafkaCommand) -> Result<ExitCode, CliError> {
    match command {
        KafkaCommand::Topics { bootstrap } => {
            let topics = tools::topics(&bootstrap).map_err(CliError::runtime)?;
            if topics.is_empty() {
                println!("No topics at {bootstrap}.");
            }
            for (topic, partitions) in topics {
                println!("{topic}\t{partitions} partition(s)");
            }
        }
        KafkaCommand::Create { bootstrap, topic, partitions } => {
            let partitions = i32::try_from(partitions)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| CliError::usage(format!("--partitions {partitions}: give 1 to 2147483647")))?;
            tools::create_topic(&bootstrap, &topic, partitions).map_err(CliError::runtime)?;
            println!("Created topic {topic} with {partitions} partition(s).");
        }
        KafkaCommand::Produce { bootstrap, topic, events, users } => {
            let sent = match events {
                Some(events) => {
                    let users = users.max(1);
                    tools::produce(&bootstrap, &topic, (0..events).map(|i| (i % users).to_string()))
                }
                None => {
                    let lines = std::io::stdin().lock().lines().map_while(Result::ok);
                    tools::produce(&bootstrap, &topic, lines)
                }
            }
            .map_err(CliError::runtime)?;
            eprintln!("Produced {sent} record(s) to {topic}.");
        }
        KafkaCommand::Consume { bootstrap, topic, max, timeout, count } => {
            let idle = weir_config::parse_duration(&timeout)
                .map_err(|e| CliError::usage(format!("--timeout {timeout}: {e}")))?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut written = Ok(());
            let read = tools::consume(&bootstrap, &topic, max, idle, |value| {
                if !count && written.is_ok() {
                    written = out.write_all(value).and_then(|()| out.write_all(b"\n"));
                }
            })
            .map_err(CliError::runtime)?;
            written.and_then(|()| out.flush()).map_err(|e| CliError::runtime(format!("writing to stdout: {e}")))?;
            drop(out);
            if count {
                println!("{read}");
            } else {
                eprintln!("Read {read} record(s) of {topic} (read_committed).");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
