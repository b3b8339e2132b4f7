//! `kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?key=value&...]`, the form `--input` and `--output`
//! take: the bootstrap servers, one topic, and options (the source's and sink's own, or
//! librdkafka properties passed through).

use std::collections::BTreeMap;

/// A parsed `kafka://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaUrl {
    /// `host:port,...`.
    pub bootstrap: String,
    /// The topic.
    pub topic: String,
    /// The query's `key=value` pairs, in order of their keys.
    pub options: BTreeMap<String, String>,
}

impl KafkaUrl {
    /// Whether `text` is meant as a Kafka URL.
    pub fn is_kafka(text: &str) -> bool {
        text.starts_with("kafka://")
    }

    /// Parses `text`; an error says what is wrong and shows the form.
    pub fn parse(text: &str) -> Result<KafkaUrl, String> {
        const FORM: &str = "kafka://HOST:PORT[,HOST:PORT]/TOPIC[?key=value&...]";
        let rest = text.strip_prefix("kafka://").ok_or_else(|| format!("'{text}' is not a {FORM} URL"))?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let Some((bootstrap, topic)) = location.split_once('/') else {
            return Err(format!("'{text}' names no topic; the form is {FORM}"));
        };
        if bootstrap.is_empty() {
            return Err(format!("'{text}' names no broker; the form is {FORM}"));
        }
        for server in bootstrap.split(',') {
            let valid = server
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !valid {
                return Err(format!("'{server}' in '{text}' is not HOST:PORT; the form is {FORM}"));
            }
        }
        let topic_ok = !topic.is_empty()
            && topic.len() <= 249
            && topic != "."
            && topic != ".."
            && topic.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !topic_ok {
            return Err(format!(
                "'{topic}' in '{text}' is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-')"
            ));
        }
        let mut options = BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(format!("'{pair}' in '{text}' is not key=value"));
            };
            if options.insert(key.to_string(), value.to_string()).is_some() {
                return Err(format!("'{key}' is given twice in '{text}'"));
            }
        }
        Ok(KafkaUrl { bootstrap: bootstrap.to_string(), topic: topic.to_string(), options })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_servers_topic_and_options() {
        let url = KafkaUrl::parse("kafka://a:9092,b:9093/events?group=g&starting-offsets=latest").unwrap();
        assert_eq!(url.bootstrap, "a:9092,b:9093");
        assert_eq!(url.topic, "events");
        assert_eq!(url.options["group"], "g");
        assert_eq!(url.options["starting-offsets"], "latest");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(KafkaUrl::parse("kafka://a:9092").unwrap_err().contains("names no topic"));
        assert!(KafkaUrl::parse("kafka:///t").unwrap_err().contains("names no broker"));
        assert!(KafkaUrl::parse("kafka://a/t").unwrap_err().contains("is not HOST:PORT"));
        assert!(KafkaUrl::parse("kafka://a:1/t/x").unwrap_err().contains("not a Kafka topic name"));
        assert!(KafkaUrl::parse("kafka://a:1/t?x").unwrap_err().contains("not key=value"));
        assert!(KafkaUrl::parse("kafka://a:1/t?x=1&x=2").unwrap_err().contains("twice"));
    }
}
