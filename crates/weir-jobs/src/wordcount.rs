//! `wordcount`: counts words of a text file; when the input ends, one `word<TAB>count` line
//! per word. Words are maximal runs of Unicode alphanumeric characters, lowercased.

use std::fmt::Write as _;

use weir_api::catalog::{ArgSpec, JobArgs, JobBuildError, JobDefinition};
use weir_api::prelude::*;
use weir_connectors::TextLineSource;
use weir_connectors::kafka::{KafkaUrl, Utf8Lines};

use crate::output::Output;

/// Splits `line` into lowercased words.
pub fn words(line: &str, mut emit: impl FnMut(String)) {
    for word in line.split(|c: char| !c.is_alphanumeric()) {
        if !word.is_empty() {
            emit(word.to_lowercase());
        }
    }
}

/// Counts each word; emits the final counts at the end of the input.
#[derive(Clone)]
pub struct CountWords {
    count: ValueState<u64>,
}

impl Default for CountWords {
    fn default() -> Self {
        CountWords { count: ValueState::new("count") }
    }
}

impl KeyedProcessFunction<String, String, (String, u64)> for CountWords {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.count.declaration()]
    }

    fn process_element(
        &mut self,
        _word: String,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, (String, u64)>,
    ) -> FnResult {
        *ctx.value(&self.count)?.get_or_insert_with(|| 0) += 1;
        Ok(())
    }

    fn on_end_of_input(
        &mut self,
        ctx: &mut EndOfInputContext<'_, String>,
        out: &mut Collector<'_, (String, u64)>,
    ) -> FnResult {
        ctx.for_each_value(&self.count, |word, count| out.collect((word.clone(), *count)))?;
        Ok(())
    }
}

/// Formats `word<TAB>count`.
pub fn format_word_count(record: &(String, u64), line: &mut String) {
    let _ = write!(line, "{}\t{}", record.0, record.1);
}

/// The `wordcount` job.
pub struct WordCount;

impl JobDefinition for WordCount {
    fn name(&self) -> &'static str {
        "wordcount"
    }

    fn description(&self) -> &'static str {
        "counts the words of a text file (bounded); one word<TAB>count line per word at the end"
    }

    fn args(&self) -> Vec<ArgSpec> {
        vec![
            ArgSpec::required(
                "input",
                "PATH|kafka://HOST:PORT/TOPIC",
                "the text file to read, or a Kafka topic of lines (read to its end unless bounded=false)",
            ),
            ArgSpec::required(
                "output",
                "DIR|-|none|kafka://HOST:PORT/TOPIC",
                "part files in DIR, '-' prints, 'none' discards, or a Kafka topic (default '-')",
            ),
        ]
    }

    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError> {
        let input: String = args.required("input")?;
        if let Some(error) = crate::kafka::unknown_scheme("--input", &input) {
            return Err(args.invalid(error));
        }
        let output = Output::from_args(args, Output::Print)?;
        let lines = if KafkaUrl::is_kafka(&input) {
            let url = KafkaUrl::parse(&input).map_err(|e| args.invalid(format!("--input {e}")))?;
            let source =
                crate::kafka::source(&url, Utf8Lines, true).map_err(|e| args.invalid(format!("--input {e}")))?;
            env.from_source(source)
        } else {
            let input = std::path::PathBuf::from(input);
            match std::fs::metadata(&input) {
                Ok(meta) if meta.is_file() => {}
                Ok(_) => return Err(args.invalid(format!("--input {} is not a file", input.display()))),
                Err(e) => {
                    return Err(args.invalid(format!("cannot read --input {}: {e}", input.display())));
                }
            }
            env.from_source(TextLineSource::new(input))
        };
        let counts = lines
            .uid("source")
            .name("source")
            .flat_map(|line: String, out: &mut Collector<'_, String>| words(&line, |w| out.collect(w)))
            .name("tokenizer")
            .key_by_ref(|word: &String| word)
            .process(CountWords::default())
            .uid("counter")
            .name("counter");
        output.attach(args, &counts, format_word_count, |record: &(String, u64), key: &mut String| {
            key.push_str(&record.0)
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_lowercased_alphanumeric_runs() {
        let mut found = Vec::new();
        words("Hello, wörld! It's 2026 — ÉTÉ_x", |w| found.push(w));
        assert_eq!(found, vec!["hello", "wörld", "it", "s", "2026", "été", "x"]);
    }
}
