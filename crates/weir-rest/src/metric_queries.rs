//! Flink's REST metric queries: `GET .../metrics` lists the metric ids an entity has, and
//! `?get=a,b` answers their values (`MetricCollectionResponseBody`); the aggregating paths
//! (`/jobs/metrics`, `.../subtasks/metrics`) answer `min`, `max`, `avg`, `sum` and `skew`
//! over jobs or subtasks, or only the aggregations `?agg=` names.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// One metric of Flink's `MetricCollectionResponseBody`: without `get`, only its id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MetricValue {
    /// The metric id (`numRecordsIn`, `0.currentInputWatermark` ...).
    pub id: String,
    /// Its value as a string, as Flink's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// One metric of Flink's `AggregatedMetricsResponseBody`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AggregatedMetric {
    /// The metric id.
    pub id: String,
    /// Smallest value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Largest value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg: Option<f64>,
    /// Sum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<f64>,
    /// Flink's skew: `(max - avg) / max * 100`, 0 when max is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew: Option<f64>,
}

/// The ids asked for with `get=a,b`, if any.
fn requested(params: &HashMap<String, String>) -> Option<Vec<String>> {
    params.get("get").map(|raw| raw.split(',').map(|id| id.trim().to_string()).filter(|id| !id.is_empty()).collect())
}

/// Flink's answer for an entity whose metrics are `all`: the ids, or the values of `get`
/// (ids it does not have are left out, as Flink).
pub fn query(all: Vec<(String, String)>, params: &HashMap<String, String>) -> Vec<MetricValue> {
    match requested(params) {
        None => all.into_iter().map(|(id, _)| MetricValue { id, value: None }).collect(),
        Some(ids) => {
            let values: BTreeMap<String, String> = all.into_iter().collect();
            ids.into_iter()
                .filter_map(|id| values.get(&id).map(|v| MetricValue { id: id.clone(), value: Some(v.clone()) }))
                .collect()
        }
    }
}

/// Flink's aggregated answer over entities, each with its metrics: without `get`, the ids;
/// with it, the aggregations of `agg` (default all) of each numeric metric asked for.
pub(crate) fn aggregate(
    entities: Vec<Vec<(String, String)>>,
    params: &HashMap<String, String>,
) -> Result<Vec<AggregatedMetric>, ApiError> {
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for entity in entities {
        for (id, value) in entity {
            let number = value.parse::<f64>().ok();
            let slot = values.entry(id).or_default();
            if let Some(number) = number {
                slot.push(number);
            }
        }
    }
    let aggregations = match params.get("agg") {
        None => vec!["min", "max", "avg", "sum", "skew"],
        Some(raw) if raw.trim().is_empty() => {
            return Err(ApiError::bad_request("agg must name at least one of min, max, avg, sum, skew"));
        }
        Some(raw) => {
            let mut chosen = Vec::new();
            for name in raw.split(',').map(|a| a.trim().to_lowercase()).filter(|a| !a.is_empty()) {
                match name.as_str() {
                    "min" => chosen.push("min"),
                    "max" => chosen.push("max"),
                    "avg" => chosen.push("avg"),
                    "sum" => chosen.push("sum"),
                    "skew" => chosen.push("skew"),
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "agg '{other}' is not one of min, max, avg, sum, skew"
                        )));
                    }
                }
            }
            chosen
        }
    };
    let Some(ids) = requested(params) else {
        return Ok(values
            .into_keys()
            .map(|id| AggregatedMetric { id, min: None, max: None, avg: None, sum: None, skew: None })
            .collect());
    };
    Ok(ids
        .into_iter()
        .filter_map(|id| {
            let numbers = values.get(&id).filter(|n| !n.is_empty())?;
            let min = numbers.iter().copied().fold(f64::INFINITY, f64::min);
            let max = numbers.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = numbers.iter().sum();
            let avg = sum / numbers.len() as f64;
            let skew = if max == 0.0 { 0.0 } else { (max - avg) / max * 100.0 };
            let pick = |name: &str, v: f64| aggregations.contains(&name).then_some(v);
            Some(AggregatedMetric {
                id,
                min: pick("min", min),
                max: pick("max", max),
                avg: pick("avg", avg),
                sum: pick("sum", sum),
                skew: pick("skew", skew),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn metrics(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn without_get_only_ids_with_get_the_values_it_has() {
        let all = metrics(&[("numRecordsIn", "5"), ("numRecordsOut", "7")]);
        assert_eq!(
            query(all.clone(), &params(&[])),
            vec![
                MetricValue { id: "numRecordsIn".into(), value: None },
                MetricValue { id: "numRecordsOut".into(), value: None }
            ]
        );
        assert_eq!(
            query(all, &params(&[("get", "numRecordsOut, nope")])),
            vec![MetricValue { id: "numRecordsOut".into(), value: Some("7".into()) }]
        );
    }

    #[test]
    fn aggregates_over_entities_as_flink() {
        let entities = vec![metrics(&[("n", "2")]), metrics(&[("n", "6")])];
        let all = aggregate(entities.clone(), &params(&[("get", "n")])).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].min, all[0].max, all[0].avg, all[0].sum), (Some(2.0), Some(6.0), Some(4.0), Some(8.0)));
        // (max - avg) / max: 2 of 6.
        assert!((all[0].skew.unwrap() - 100.0 / 3.0).abs() < 1e-9, "{:?}", all[0].skew);
        let sum = aggregate(entities.clone(), &params(&[("get", "n"), ("agg", "sum")])).unwrap();
        assert_eq!(sum[0].sum, Some(8.0));
        assert_eq!(sum[0].min, None);
        let err = aggregate(entities, &params(&[("get", "n"), ("agg", "median")])).unwrap_err();
        assert!(err.message.contains("median"), "{}", err.message);
    }
}
