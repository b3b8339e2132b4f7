//! `kafka://` URLs for the built-in jobs' `--input` and `--output`
//! (docs/connectors.md lists the options).

use weir_connectors::kafka::{
    DeliveryGuarantee, KafkaDeserializer, KafkaSink, KafkaSinkRecord, KafkaSource, KafkaUrl, OffsetReset,
    StartingOffsets, Topics,
};

/// The forms `--input` and `--output` take, for the error on any other URL scheme.
pub const KNOWN_FORMS: &str = "a local path, '-' (stdout, --output only) or kafka://HOST:PORT/TOPIC";

/// An error for `text` when it has a URL scheme weir does not know.
pub fn unknown_scheme(flag: &str, text: &str) -> Option<String> {
    let (scheme, _) = text.split_once("://")?;
    (scheme != "kafka")
        .then(|| format!("{flag} {text}: weir does not know the scheme '{scheme}://'; give {KNOWN_FORMS}"))
}

/// The source a `kafka://` `--input` names; `bounded_by_default` for jobs that only emit at
/// the end of their input.
pub fn source<T: Send + 'static>(
    url: &KafkaUrl,
    deserializer: impl KafkaDeserializer<T>,
    bounded_by_default: bool,
) -> Result<KafkaSource<T>, String> {
    let mut source = KafkaSource::new(&url.bootstrap, Topics::Names(vec![url.topic.clone()]), deserializer);
    let group = url.options.get("group").or_else(|| url.options.get("group.id"));
    if let Some(group) = group {
        source = source.group_id(group);
    }
    let reset = match url.options.get("auto.offset.reset").map(String::as_str) {
        None | Some("earliest" | "smallest" | "beginning") => OffsetReset::Earliest,
        Some("latest" | "largest" | "end") => OffsetReset::Latest,
        Some("none" | "error") => OffsetReset::None,
        Some(other) => return Err(format!("auto.offset.reset '{other}' is not one of earliest, latest, none")),
    };
    let starting = match url.options.get("starting-offsets").map(String::as_str) {
        None if group.is_some() => StartingOffsets::Committed(reset),
        None | Some("earliest") => StartingOffsets::Earliest,
        Some("latest") => StartingOffsets::Latest,
        Some("committed") => StartingOffsets::Committed(reset),
        Some(other) => match other.strip_prefix("timestamp:").map(str::parse::<i64>) {
            Some(Ok(ms)) => StartingOffsets::Timestamp(ms),
            _ => {
                return Err(format!(
                    "starting-offsets '{other}' is not one of earliest, latest, committed, timestamp:<epoch ms>"
                ));
            }
        },
    };
    source = source.starting_offsets(starting);
    let bounded = match url.options.get("bounded").map(String::as_str) {
        None => bounded_by_default,
        Some("true") => true,
        Some("false") => false,
        Some(other) => return Err(format!("bounded '{other}' is not true or false")),
    };
    if bounded {
        source = source.bounded();
    }
    if url.options.get("skip-undeserializable").is_some_and(|v| v == "true") {
        source = source.skip_undeserializable();
    }
    if let Some(ms) = url.options.get("startup-timeout-ms") {
        let ms: u64 = ms.parse().map_err(|_| format!("startup-timeout-ms '{ms}' is not a number of milliseconds"))?;
        source = source.startup_timeout(std::time::Duration::from_millis(ms));
    }
    const OWN: [&str; 7] = [
        "group",
        "group.id",
        "auto.offset.reset",
        "starting-offsets",
        "bounded",
        "skip-undeserializable",
        "startup-timeout-ms",
    ];
    for (key, value) in &url.options {
        if !OWN.contains(&key.as_str()) {
            source = source.property(key, value)?;
        }
    }
    Ok(source)
}

/// The sink a `kafka://` `--output` names: exactly-once unless `delivery=` says otherwise.
pub fn sink<T: Send + 'static>(
    url: &KafkaUrl,
    serializer: impl Fn(&T) -> KafkaSinkRecord + Send + Sync + 'static,
) -> Result<KafkaSink<T>, String> {
    let guarantee: DeliveryGuarantee =
        url.options.get("delivery").map(|d| d.parse()).transpose()?.unwrap_or(DeliveryGuarantee::ExactlyOnce);
    let mut sink = KafkaSink::new(&url.bootstrap, &url.topic, serializer).delivery_guarantee(guarantee);
    if let Some(prefix) = url.options.get("transactional-id-prefix") {
        sink = sink.transactional_id_prefix(prefix);
    }
    for (key, value) in &url.options {
        if !matches!(key.as_str(), "delivery" | "transactional-id-prefix") {
            sink = sink.property(key, value);
        }
    }
    Ok(sink)
}
