//! A small blocking client of the REST API (the CLI's side of `list` and `cancel`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::CliError;

/// Time the CLI waits for one REST answer.
const REST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Talks to one cluster's REST API.
pub struct RestClient {
    /// The base URL; a [`Retry`] may move it to the JobManager that leads now.
    base: Mutex<String>,
    agent: ureq::Agent,
    /// What to do when the address does not answer, when the default advice is wrong.
    unreachable_hint: Option<String>,
    retry: Option<Retry>,
    /// The first retry was announced.
    announced: AtomicBool,
}

/// Where the JobManager is now (with high availability: the leader etcd names); asked
/// before each retry.
pub type Locate = Box<dyn Fn() -> Result<String, CliError> + Send + Sync>;

/// How a request is tried again while its JobManager does not answer, as Flink's CLI does
/// with `rest.retry.max-attempts` and `rest.retry.delay`: a JobManager failover takes a few
/// seconds, and a CLI command issued in them should wait it out rather than fail.
pub struct Retry {
    /// Tries in all (1: no retry).
    pub attempts: u32,
    /// The wait between two tries.
    pub delay: Duration,
    /// Where to send the next try.
    pub locate: Option<Locate>,
}

/// A response: status code and body.
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Body text.
    pub body: String,
}

impl RestClient {
    /// A client of `address` (`HOST:PORT` or a URL).
    pub fn new(address: &str) -> RestClient {
        let base = if address.starts_with("http://") || address.starts_with("https://") {
            address.trim_end_matches('/').to_string()
        } else {
            format!("http://{}", address.trim_end_matches('/'))
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REST_REQUEST_TIMEOUT))
            .build()
            .new_agent();
        RestClient {
            base: Mutex::new(base),
            agent,
            unreachable_hint: None,
            retry: None,
            announced: AtomicBool::new(false),
        }
    }

    /// The same client, trying again as `retry` says while the JobManager does not answer.
    pub fn with_retry(mut self, retry: Retry) -> RestClient {
        self.retry = Some(retry);
        self
    }

    /// The same client, advising `hint` when its address does not answer.
    pub fn with_unreachable_hint(mut self, hint: String) -> RestClient {
        self.unreachable_hint = Some(hint);
        self
    }

    /// The base URL.
    pub fn base(&self) -> String {
        self.base.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn unreachable(&self, error: ureq::Error) -> CliError {
        let hint = self
            .unreachable_hint
            .as_deref()
            .unwrap_or("is a job or cluster running there? pass -m HOST:PORT or set rest.address/rest.port");
        CliError::runtime(format!("cannot reach the JobManager REST API at {} ({error}); {hint}", self.base()))
    }

    fn read(&self, response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Response, ureq::Error> {
        let mut response = response?;
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string()?;
        Ok(Response { status, body })
    }

    /// Sends `request` to the base URL, and with a [`Retry`] again (to where it locates the
    /// JobManager) while no JobManager answers, the one that does is unavailable (503), or
    /// it is a standby whose leader did not answer (502: the leader is failing over).
    fn send(
        &self,
        request: impl Fn(&str) -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Response, CliError> {
        let attempts = self.retry.as_ref().map_or(1, |r| r.attempts.max(1));
        let mut attempt = 1;
        loop {
            let outcome = self.read(request(&self.base()));
            let retryable = match &outcome {
                Ok(response) => matches!(response.status, 502 | 503),
                Err(error) => is_unanswered(error),
            };
            let Some(retry) = self.retry.as_ref().filter(|_| retryable && attempt < attempts) else {
                return outcome.map_err(|e| self.unreachable(e));
            };
            if !self.announced.swap(true, Ordering::Relaxed) {
                let why = match &outcome {
                    Ok(response) => error_text(&response.body),
                    Err(error) => error.to_string(),
                };
                eprintln!(
                    "The JobManager at {} does not answer ({why}); trying again every {:?}, {} times at most (rest.retry.delay, rest.retry.max-attempts)",
                    self.base(),
                    retry.delay,
                    attempts - 1
                );
            }
            std::thread::sleep(retry.delay);
            if let Some(Ok(address)) = retry.locate.as_ref().map(|locate| locate()) {
                *self.base.lock().unwrap_or_else(|p| p.into_inner()) = RestClient::new(&address).base();
            }
            attempt += 1;
        }
    }

    /// GET `path`.
    pub fn get(&self, path: &str) -> Result<Response, CliError> {
        self.send(|base| self.agent.get(format!("{base}{path}")).call())
    }

    /// PATCH `path` with an empty body.
    pub fn patch(&self, path: &str) -> Result<Response, CliError> {
        self.send(|base| self.agent.patch(format!("{base}{path}")).send_empty())
    }

    /// POST `path` with a JSON body.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Result<Response, CliError> {
        let text = body.to_string();
        self.send(|base| {
            self.agent.post(format!("{base}{path}")).header("content-type", "application/json").send(text.as_bytes())
        })
    }

    /// GET `path` and decode a 200 answer as JSON.
    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        let response = self.get(path)?;
        if response.status != 200 {
            return Err(CliError::runtime(format!(
                "{}{path} answered {}: {}",
                self.base(),
                response.status,
                error_text(&response.body)
            )));
        }
        serde_json::from_str(&response.body).map_err(|e| {
            CliError::runtime(format!("{}{path} answered something that is not a weir REST response: {e}", self.base()))
        })
    }
}

/// Whether no JobManager answered at all (refused, reset, timed out, not found): a failover
/// may be under way. An answer, even an error, is not retried.
fn is_unanswered(error: &ureq::Error) -> bool {
    matches!(
        error,
        ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::Timeout(_) | ureq::Error::HostNotFound
    )
}

/// Turns a job request's non-2xx answer into the error a user reads (`action`: "cancel job").
pub fn check_job_response(
    response: &Response,
    client: &RestClient,
    job_id: weir_types::JobId,
    action: &str,
) -> Result<(), CliError> {
    match response.status {
        200..=299 => Ok(()),
        404 => Err(CliError::runtime(format!(
            "job {job_id} not found on the cluster at {}; `weir list` shows its jobs",
            client.base()
        ))),
        _ => Err(CliError::runtime(format!("cannot {action} {job_id}: {}", error_text(&response.body)))),
    }
}

/// The first message of a Flink-style `{"errors":[...]}` body, or the body itself.
pub fn error_text(body: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<String>,
    }
    match serde_json::from_str::<Errors>(body) {
        Ok(errors) if !errors.errors.is_empty() => errors.errors.join("; "),
        _ => body.trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// Answers one request per connection with each status of `statuses` in turn.
    fn server(statuses: Vec<u16>) -> (String, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let handle = std::thread::spawn(move || {
            for status in statuses {
                let (mut stream, _) = listener.accept().unwrap();
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let body = format!("{{\"errors\": [\"status {status}\"]}}");
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).unwrap();
            }
        });
        (address, handle)
    }

    /// A standby whose leader is failing over answers 503 (weir) or 502 (a proxy in front):
    /// both are tried again until the new leader answers.
    #[test]
    fn a_failing_over_leader_is_waited_out() {
        let (address, handle) = server(vec![502, 503, 200]);
        let client =
            RestClient::new(&address).with_retry(Retry { attempts: 5, delay: Duration::from_millis(10), locate: None });
        let response = client.get("/jobs/overview").unwrap();
        assert_eq!(response.status, 200);
        handle.join().unwrap();
    }

    /// Any other answer is the answer: no retry.
    #[test]
    fn an_error_answer_is_not_retried() {
        let (address, handle) = server(vec![500]);
        let client =
            RestClient::new(&address).with_retry(Retry { attempts: 5, delay: Duration::from_millis(10), locate: None });
        assert_eq!(client.get("/jobs/overview").unwrap().status, 500);
        handle.join().unwrap();
    }
}
