//! A small etcd v3 client over etcd's JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`,
//! `/v3/lease/grant`, `/v3/lease/keepalive`, ...): keys, prefixes, transactions and leases,
//! which is all leader election and the HA store need.
//!
//! Written here rather than taken from `etcd-client`: that crate is gRPC (tonic + prost) and
//! its build needs `protoc` on every machine that runs `cargo install weir`; the gateway is
//! etcd's documented HTTP API, and these calls are a few JSON objects each. Keys and values
//! are base64 in JSON, 64-bit integers are strings (proto3 JSON), as the gateway speaks them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::kv::KeyValueStore;
pub use crate::kv::{Compare, KeyValue, Op, TxnResult};

/// Longest one request to etcd may take before the next endpoint is tried.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// An etcd request that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint answered.
    #[error("cannot reach etcd at {endpoints} ({reason}); start etcd there or fix high-availability.etcd.endpoints")]
    Unreachable {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The last failure.
        reason: String,
    },
    /// The Kubernetes API server (`high-availability.type: kubernetes`) could not be reached
    /// or refused a request on the HA ConfigMap.
    #[error(
        "cannot {operation} ConfigMap {config_map} ({reason}); check that the Kubernetes API server is reachable and that this pod's service account may get, create and update ConfigMaps (deploy/kubernetes/rbac.yaml)"
    )]
    Kubernetes {
        /// `namespace/name`.
        config_map: String,
        /// What was asked (`read`, `update`).
        operation: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// etcd answered with an error.
    #[error("etcd at {endpoint} refused {operation}: {reason}")]
    Refused {
        /// The endpoint that answered.
        endpoint: String,
        /// What was asked.
        operation: &'static str,
        /// What etcd said.
        reason: String,
    },
}

/// A client of one etcd cluster (several endpoints, tried in turn).
pub struct EtcdClient {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    current: AtomicUsize,
}

fn encode(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// The end of the range of every key starting with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return encode(&end);
        }
    }
    // Every key: range_end "\0".
    encode(&[0])
}

fn int(value: &Value) -> i64 {
    match value {
        Value::String(text) => text.parse().unwrap_or_default(),
        Value::Number(number) => number.as_i64().unwrap_or_default(),
        _ => 0,
    }
}

fn key_value(value: &Value) -> Option<KeyValue> {
    let key = BASE64.decode(value["key"].as_str()?).ok()?;
    let bytes = match value["value"].as_str() {
        Some(text) => BASE64.decode(text).ok()?,
        None => Vec::new(),
    };
    Some(KeyValue {
        key: String::from_utf8(key).ok()?,
        value: bytes,
        create_revision: int(&value["create_revision"]),
        mod_revision: int(&value["mod_revision"]),
        lease: int(&value["lease"]),
    })
}

fn put_json(key: &str, value: &[u8], lease: i64) -> Value {
    let mut put = json!({"key": encode(key.as_bytes()), "value": encode(value)});
    if lease != 0 {
        put["lease"] = json!(lease.to_string());
    }
    put
}

fn op_json(op: &Op) -> Value {
    match op {
        Op::Put { key, value, lease } => json!({"request_put": put_json(key, value, *lease)}),
        Op::Delete { key, prefix } => {
            let mut delete = json!({"key": encode(key.as_bytes())});
            if *prefix {
                delete["range_end"] = json!(prefix_end(key));
            }
            json!({"request_delete_range": delete})
        }
    }
}

impl EtcdClient {
    /// A client of `endpoints` (`http://host:port`), checked by one request: an unreachable
    /// etcd is an error naming the endpoints.
    pub fn connect(endpoints: &[String]) -> Result<EtcdClient, EtcdError> {
        let client = EtcdClient::new(endpoints, REQUEST_TIMEOUT);
        client.get("/weir/")?;
        Ok(client)
    }

    /// A client whose requests time out after `timeout` (no request is made).
    pub fn new(endpoints: &[String], timeout: Duration) -> EtcdClient {
        let endpoints: Vec<String> = endpoints.iter().map(|e| e.trim().trim_end_matches('/').to_string()).collect();
        let agent =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().new_agent();
        EtcdClient { endpoints, agent, current: AtomicUsize::new(0) }
    }

    /// The endpoints, as configured.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// POSTs `body` to `path` on the current endpoint, then on the others.
    fn call(&self, operation: &'static str, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let count = self.endpoints.len().max(1);
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::from("no endpoint configured");
        for step in 0..count {
            let index = (start + step) % count;
            let Some(endpoint) = self.endpoints.get(index) else { break };
            let response = self.agent.post(&format!("{endpoint}{path}")).send_json(body);
            let mut response = match response {
                Ok(response) => response,
                Err(error) => {
                    last = error.to_string();
                    continue;
                }
            };
            let status = response.status().as_u16();
            let text = response.body_mut().read_to_string().unwrap_or_default();
            if status == 200 {
                self.current.store(index, Ordering::Relaxed);
                // The keepalive endpoint streams: its first JSON object is the answer.
                let first = text.lines().next().unwrap_or_default();
                return serde_json::from_str(first).map_err(|e| EtcdError::Refused {
                    endpoint: endpoint.clone(),
                    operation,
                    reason: format!("unreadable answer ({e}): {first}"),
                });
            }
            if status >= 500 && status != 503 {
                last = format!("HTTP {status}: {text}");
                continue;
            }
            let reason = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().or(v["message"].as_str()).map(str::to_string))
                .unwrap_or(text);
            return Err(EtcdError::Refused { endpoint: endpoint.clone(), operation, reason });
        }
        Err(EtcdError::Unreachable { endpoints: self.endpoints.join(","), reason: last })
    }

    /// The key `key`, if it exists.
    pub fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let answer = self.call("a read", "/v3/kv/range", &json!({"key": encode(key.as_bytes())}))?;
        Ok(answer["kvs"].as_array().and_then(|kvs| kvs.first()).and_then(key_value))
    }

    /// Every key starting with `prefix`, in key order.
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        let body = json!({"key": encode(prefix.as_bytes()), "range_end": prefix_end(prefix)});
        let answer = self.call("a read", "/v3/kv/range", &body)?;
        Ok(answer["kvs"].as_array().map(|kvs| kvs.iter().filter_map(key_value).collect()).unwrap_or_default())
    }

    /// Sets `key` (no condition).
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        self.call("a write", "/v3/kv/put", &put_json(key, value, lease)).map(|_| ())
    }

    /// Runs `success` if every comparison holds, else `failure`.
    pub fn txn(&self, compares: &[Compare], success: &[Op], failure: &[Op]) -> Result<TxnResult, EtcdError> {
        let compare: Vec<Value> = compares
            .iter()
            .map(|compare| match compare {
                Compare::CreateRevision(key, revision) => json!({
                    "key": encode(key.as_bytes()),
                    "target": "CREATE",
                    "result": "EQUAL",
                    "create_revision": revision.to_string(),
                }),
            })
            .collect();
        let body = json!({
            "compare": compare,
            "success": success.iter().map(op_json).collect::<Vec<_>>(),
            "failure": failure.iter().map(op_json).collect::<Vec<_>>(),
        });
        let answer = self.call("a transaction", "/v3/kv/txn", &body)?;
        Ok(TxnResult {
            succeeded: answer["succeeded"].as_bool().unwrap_or(false),
            revision: int(&answer["header"]["revision"]),
        })
    }

    /// A new lease of `ttl` (etcd rounds it up to its minimum, about 2 s).
    pub fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError> {
        let seconds = ttl.as_secs().max(1);
        let answer = self.call("a lease", "/v3/lease/grant", &json!({"TTL": seconds.to_string()}))?;
        let id = int(&answer["ID"]);
        if id == 0 {
            return Err(EtcdError::Refused {
                endpoint: self.endpoints.join(","),
                operation: "a lease",
                reason: answer["error"].as_str().unwrap_or("no lease id in the answer").to_string(),
            });
        }
        Ok((id, Duration::from_secs(int(&answer["TTL"]).max(1) as u64)))
    }

    /// Renews `lease`; `None` when it has expired (or was revoked).
    pub fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdError> {
        let answer = self.call("a lease renewal", "/v3/lease/keepalive", &json!({"ID": lease.to_string()}))?;
        let ttl = int(&answer["result"]["TTL"]);
        Ok((ttl > 0).then(|| Duration::from_secs(ttl as u64)))
    }

    /// Ends `lease` now: the keys attached to it go.
    pub fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("a lease revocation", "/v3/lease/revoke", &json!({"ID": lease.to_string()})).map(|_| ())
    }
}

impl KeyValueStore for EtcdClient {
    fn describe(&self) -> String {
        format!("etcd at {}", self.endpoints.join(","))
    }
    fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        EtcdClient::get(self, key)
    }
    fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        EtcdClient::get_prefix(self, prefix)
    }
    fn txn(&self, compares: &[Compare], success: &[Op], failure: &[Op]) -> Result<TxnResult, EtcdError> {
        EtcdClient::txn(self, compares, success, failure)
    }
    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        EtcdClient::put(self, key, value, lease)
    }
    fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError> {
        EtcdClient::grant(self, ttl)
    }
    fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdError> {
        EtcdClient::keep_alive(self, lease)
    }
    fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        EtcdClient::revoke(self, lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_follow_etcd_s_rule() {
        assert_eq!(BASE64.decode(prefix_end("/weir/")).unwrap(), b"/weir0");
        assert_eq!(BASE64.decode(prefix_end("a\u{7f}")).unwrap(), b"a\x80");
    }

    #[test]
    fn an_unreachable_endpoint_is_an_error_naming_it() {
        let error = EtcdClient::connect(&["http://127.0.0.1:1".to_string()]).err().unwrap();
        let message = error.to_string();
        assert!(message.starts_with("cannot reach etcd at http://127.0.0.1:1"), "{message}");
        assert!(message.contains("high-availability.etcd.endpoints"), "{message}");
    }
}
