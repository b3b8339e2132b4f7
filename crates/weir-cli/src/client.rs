//! A small blocking client of the REST API (the CLI's side of `list` and `cancel`).

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::CliError;

/// Time the CLI waits for one REST answer.
const REST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Talks to one cluster's REST API.
pub struct RestClient {
    base: String,
    agent: ureq::Agent,
    /// What to do when the address does not answer, when the default advice is wrong.
    unreachable_hint: Option<String>,
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
        RestClient { base, agent, unreachable_hint: None }
    }

    /// The same client, advising `hint` when its address does not answer.
    pub fn with_unreachable_hint(mut self, hint: String) -> RestClient {
        self.unreachable_hint = Some(hint);
        self
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn unreachable(&self, error: ureq::Error) -> CliError {
        let hint = self
            .unreachable_hint
            .as_deref()
            .unwrap_or("is a job or cluster running there? pass -m HOST:PORT or set rest.address/rest.port");
        CliError::runtime(format!("cannot reach the JobManager REST API at {} ({error}); {hint}", self.base))
    }

    fn read(&self, response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Response, CliError> {
        let mut response = response.map_err(|e| self.unreachable(e))?;
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().map_err(|e| self.unreachable(e))?;
        Ok(Response { status, body })
    }

    /// GET `path`.
    pub fn get(&self, path: &str) -> Result<Response, CliError> {
        self.read(self.agent.get(format!("{}{path}", self.base)).call())
    }

    /// PATCH `path` with an empty body.
    pub fn patch(&self, path: &str) -> Result<Response, CliError> {
        self.read(self.agent.patch(format!("{}{path}", self.base)).send_empty())
    }

    /// POST `path` with a JSON body.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Result<Response, CliError> {
        let text = body.to_string();
        self.read(
            self.agent
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .send(text.as_bytes()),
        )
    }

    /// GET `path` and decode a 200 answer as JSON.
    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        let response = self.get(path)?;
        if response.status != 200 {
            return Err(CliError::runtime(format!(
                "{}{path} answered {}: {}",
                self.base,
                response.status,
                error_text(&response.body)
            )));
        }
        serde_json::from_str(&response.body).map_err(|e| {
            CliError::runtime(format!("{}{path} answered something that is not a weir REST response: {e}", self.base))
        })
    }
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
