//! The controller's client of a deployment cluster's REST API (Flink's paths): the job, its
//! checkpoints, stop-with-savepoint, savepoints, cancel.

use std::time::Duration;

use serde_json::Value;

/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A job as the controller needs to see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    /// Flink's job state.
    pub state: String,
    /// Every subtask is RUNNING.
    pub all_running: bool,
    /// Some subtask is neither RUNNING nor FINISHED (created, scheduled, deploying,
    /// initializing): the job is starting, or restarting and maybe waiting for slots.
    pub starting: bool,
    /// Completed checkpoints of the job.
    pub completed_checkpoints: u64,
    /// The newest completed checkpoint's path.
    pub latest_checkpoint: Option<String>,
    /// The newest savepoint's path.
    pub latest_savepoint: Option<String>,
    /// When it was submitted, epoch ms.
    pub start_time: Option<u64>,
}

/// Where a savepoint request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SavepointState {
    /// Still being taken.
    InProgress,
    /// Written there.
    Completed(String),
    /// It failed, for this reason.
    Failed(String),
}

/// One cluster's REST API.
pub struct ClusterApi {
    base: String,
    agent: ureq::Agent,
}

impl ClusterApi {
    /// The API at `base` (`http://host:port`).
    pub fn new(base: &str) -> ClusterApi {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .new_agent();
        ClusterApi { base: base.trim_end_matches('/').to_string(), agent }
    }

    fn get(&self, path: &str) -> Result<(u16, Value), String> {
        let mut response = self
            .agent
            .get(format!("{}{path}", self.base))
            .call()
            .map_err(|e| format!("{} does not answer ({e})", self.base))?;
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().map_err(|e| e.to_string())?;
        Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }

    fn send(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.base);
        let result = match (method, body) {
            ("PATCH", _) => self.agent.patch(&url).send_empty(),
            (_, Some(body)) => self.agent.post(&url).send_json(&body),
            (_, None) => self.agent.post(&url).send_empty(),
        };
        let mut response = result.map_err(|e| format!("{} does not answer ({e})", self.base))?;
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().map_err(|e| e.to_string())?;
        Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }

    /// Whether the REST API answers at all.
    pub fn is_up(&self) -> bool {
        matches!(self.get("/overview"), Ok((200, _)))
    }

    /// Every job of the cluster: (id, state).
    pub fn jobs(&self) -> Result<Vec<(String, String)>, String> {
        let (status, body) = self.get("/jobs/overview")?;
        if status != 200 {
            return Err(format!("{}/jobs/overview answered {status}", self.base));
        }
        let jobs = body["jobs"].as_array().cloned().unwrap_or_default();
        Ok(jobs
            .iter()
            .filter_map(|job| Some((job["jid"].as_str()?.to_string(), job["state"].as_str()?.to_string())))
            .collect())
    }

    /// One job; `None` when the cluster does not know it.
    pub fn job(&self, job_id: &str) -> Result<Option<JobView>, String> {
        let (status, job) = self.get(&format!("/jobs/{job_id}"))?;
        if status == 404 {
            return Ok(None);
        }
        if status != 200 {
            return Err(format!("{}/jobs/{job_id} answered {status}", self.base));
        }
        let state = job["state"].as_str().unwrap_or("UNKNOWN").to_string();
        let vertices = job["vertices"].as_array().cloned().unwrap_or_default();
        let all_running = !vertices.is_empty()
            && vertices.iter().all(|vertex| {
                vertex["subtasks"].as_array().is_some_and(|subtasks| {
                    !subtasks.is_empty() && subtasks.iter().all(|s| s["status"].as_str() == Some("RUNNING"))
                })
            });
        let starting = vertices.iter().any(|vertex| {
            vertex["subtasks"].as_array().is_some_and(|subtasks| {
                subtasks.iter().any(|s| !matches!(s["status"].as_str(), Some("RUNNING" | "FINISHED")))
            })
        });
        let (_, checkpoints) = self.get(&format!("/jobs/{job_id}/checkpoints"))?;
        let path = |value: &Value| value["external_path"].as_str().map(str::to_string);
        Ok(Some(JobView {
            state,
            all_running,
            starting,
            completed_checkpoints: checkpoints["counts"]["completed"].as_u64().unwrap_or(0),
            latest_checkpoint: path(&checkpoints["latest"]["completed"]),
            latest_savepoint: path(&checkpoints["latest"]["savepoint"]),
            start_time: job["start-time"].as_u64(),
        }))
    }

    /// The job's newest failure, as its exception history has it.
    pub fn root_exception(&self, job_id: &str) -> Option<String> {
        let (_, body) = self.get(&format!("/jobs/{job_id}/exceptions")).ok()?;
        body["exceptionHistory"]["entries"][0]["stacktrace"].as_str().map(str::to_string)
    }

    /// Stop-with-savepoint into `directory`: the request id.
    pub fn stop_with_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String> {
        let body = serde_json::json!({ "targetDirectory": directory, "drain": false });
        self.trigger(&format!("/jobs/{job_id}/stop"), body)
    }

    /// A savepoint into `directory`, the job going on: the request id.
    pub fn trigger_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String> {
        let body = serde_json::json!({ "target-directory": directory, "cancel-job": false });
        self.trigger(&format!("/jobs/{job_id}/savepoints"), body)
    }

    fn trigger(&self, path: &str, body: Value) -> Result<String, String> {
        let (status, answer) = self.send("POST", path, Some(body))?;
        match answer["request-id"].as_str() {
            Some(id) if status == 202 || status == 200 => Ok(id.to_string()),
            _ => Err(error_text(status, &answer)),
        }
    }

    /// Where a savepoint request is.
    pub fn savepoint(&self, job_id: &str, request_id: &str) -> Result<SavepointState, String> {
        let (status, body) = self.get(&format!("/jobs/{job_id}/savepoints/{request_id}"))?;
        if status != 200 {
            return Err(error_text(status, &body));
        }
        if body["status"]["id"].as_str() != Some("COMPLETED") {
            return Ok(SavepointState::InProgress);
        }
        if let Some(location) = body["operation"]["location"].as_str() {
            return Ok(SavepointState::Completed(location.to_string()));
        }
        Ok(SavepointState::Failed(
            body["operation"]["failure-cause"]["stack-trace"].as_str().unwrap_or("no cause given").to_string(),
        ))
    }

    /// Cancels the job.
    pub fn cancel(&self, job_id: &str) -> Result<(), String> {
        let (status, body) = self.send("PATCH", &format!("/jobs/{job_id}?mode=cancel"), None)?;
        if status == 202 || status == 200 { Ok(()) } else { Err(error_text(status, &body)) }
    }
}

fn error_text(status: u16, body: &Value) -> String {
    match body["errors"].as_array().and_then(|e| e.first()).and_then(Value::as_str) {
        Some(message) => message.to_string(),
        None => format!("HTTP {status}"),
    }
}
