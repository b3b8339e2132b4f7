//! The REST API over real HTTP: Flink-shaped answers for bounded, cancelled and failed jobs,
//! and Flink's error shape for everything a client can get wrong.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_api::prelude::*;
use weir_rest::{ClusterInfo, RestServer};
use weir_runtime::{Dispatcher, JobMaster, JobSettings};

const DEADLINE: Duration = Duration::from_secs(30);

fn settings(p: u32) -> JobSettings {
    JobSettings::with_parallelism(p)
}

fn start(slots: u32) -> (Arc<Dispatcher>, RestServer) {
    let dispatcher = Dispatcher::new("localhost");
    let server = RestServer::start(
        "127.0.0.1",
        0,
        Arc::clone(&dispatcher),
        ClusterInfo {
            taskmanagers: 1,
            slots_total: slots,
            version: "0.1.0-test".to_string(),
            configuration: vec![
                ("parallelism.default".into(), "2".into()),
                ("s3.secret-key".into(), weir_config_hidden().into()),
            ],
            ..ClusterInfo::default()
        },
    )
    .unwrap();
    (dispatcher, server)
}

struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    fn new(server: &RestServer) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build();
        Client { agent: ureq::Agent::new_with_config(config), base: server.url() }
    }

    fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>, what: &str) -> (u16, Value) {
        let mut response = response.unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{what} answered {status} with non-JSON {text:?}: {e}"));
        (status, body)
    }

    fn get(&self, path: &str) -> (u16, Value) {
        Self::answer(self.agent.get(format!("{}{path}", self.base)).call(), &format!("GET {path}"))
    }

    fn get_ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    fn patch(&self, path: &str) -> (u16, Value) {
        Self::answer(self.agent.patch(format!("{}{path}", self.base)).send_empty(), &format!("PATCH {path}"))
    }

    fn post(&self, path: &str) -> (u16, Value) {
        Self::answer(self.agent.post(format!("{}{path}", self.base)).send_empty(), &format!("POST {path}"))
    }

    fn post_json(&self, path: &str, body: &str) -> (u16, Value) {
        let request = self.agent.post(format!("{}{path}", self.base)).header("content-type", "application/json");
        Self::answer(request.send(body.as_bytes()), &format!("POST {path}"))
    }

    /// Polls the job's state over REST until it is `want`.
    fn wait_for_state(&self, job: &str, want: &str) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let body = self.get_ok(&format!("/jobs/{job}/status"));
            if body["status"] == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "job {job} still {} after {DEADLINE:?}, expected {want}",
                body["status"]
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Ends its job when the test ends, however it ends.
struct EndOnDrop(Arc<JobMaster>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        let _ = self.0.cancel();
        self.0.wait_terminal(Some(DEADLINE));
    }
}

fn submit_bounded(dispatcher: &Dispatcher) -> EndOnDrop {
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..2_000u64).map(|i| i % 7).collect()))
        .uid("source")
        .key_by(|u: &u64| *u)
        .process(RunningCount::default())
        .uid("counter")
        .sink_to(CollectSink::default())
        .uid("sink");
    EndOnDrop(dispatcher.submit(env.build("bounded count").unwrap(), settings(2)).unwrap())
}

/// An unbounded job over a gently paced source.
fn submit_endless(dispatcher: &Dispatcher) -> EndOnDrop {
    let env = StreamExecutionEnvironment::new();
    env.from_source(EndlessSource::paced(16, Duration::from_millis(2)))
        .key_by(|v: &u64| *v % 10)
        .process(RunningCount::default())
        .sink_to(CollectSink::default());
    EndOnDrop(dispatcher.submit(env.build("endless").unwrap(), settings(2)).unwrap())
}

fn assert_error(status: u16, body: &Value, want_status: u16, want_text: &str) {
    assert_eq!(status, want_status, "{body}");
    let errors = body["errors"].as_array().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(errors.len(), 1, "{body}");
    let message = errors[0].as_str().unwrap();
    assert!(message.contains(want_text), "{message:?} lacks {want_text:?}");
}

#[test]
fn a_finished_job_is_reported_like_flink() {
    let (dispatcher, server) = start(4);
    let client = Client::new(&server);
    let job = submit_bounded(&dispatcher);
    let id = job.0.job_id().to_string();
    client.wait_for_state(&id, "FINISHED");

    let overview = client.get_ok("/jobs/overview");
    let jobs = overview["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["jid"], id.as_str());
    assert_eq!(jobs[0]["name"], "bounded count");
    assert_eq!(jobs[0]["state"], "FINISHED");
    assert!(jobs[0]["start-time"].as_u64().unwrap() > 0);
    assert!(jobs[0]["end-time"].as_i64().unwrap() >= jobs[0]["start-time"].as_i64().unwrap());
    assert_eq!(jobs[0]["tasks"]["total"], 4);
    assert_eq!(jobs[0]["tasks"]["finished"], 4);

    let listed = client.get_ok("/jobs");
    assert_eq!(listed["jobs"][0]["id"], id.as_str());
    assert_eq!(listed["jobs"][0]["status"], "FINISHED");

    for path in [format!("/jobs/{id}"), format!("/v1/jobs/{id}")] {
        let details = client.get_ok(&path);
        assert_eq!(details["jid"], id.as_str(), "{path}");
        assert_eq!(details["name"], "bounded count");
        assert_eq!(details["state"], "FINISHED");
        assert_eq!(details["maxParallelism"], 128);
        for state in ["CREATED", "RUNNING", "FINISHED"] {
            assert!(details["timestamps"][state].as_u64().is_some(), "{state} missing in {}", details["timestamps"]);
        }
        let vertices = details["vertices"].as_array().unwrap();
        assert_eq!(vertices.len(), 2, "source, then counter chained with sink");
        for vertex in vertices {
            assert_eq!(vertex["parallelism"], 2);
            assert_eq!(vertex["maxParallelism"], 128);
            assert_eq!(vertex["status"], "FINISHED");
            let subtasks = vertex["subtasks"].as_array().unwrap();
            assert_eq!(subtasks.len(), 2);
            assert!(subtasks.iter().all(|s| s["status"] == "FINISHED"));
        }
    }
    assert_eq!(client.get_ok(&format!("/v1/jobs/{id}/status"))["status"], "FINISHED");

    let details = client.get_ok(&format!("/jobs/{id}"));
    let vertex_id = details["vertices"][1]["id"].as_str().unwrap().to_string();
    let vertex = client.get_ok(&format!("/jobs/{id}/vertices/{vertex_id}"));
    assert_eq!(vertex["id"], vertex_id.as_str());
    assert_eq!(vertex["name"], details["vertices"][1]["name"]);
    assert_eq!(vertex["parallelism"], 2);
    assert_eq!(vertex["maxParallelism"], 128);
    assert!(vertex["now"].as_u64().unwrap() > 0);
    assert_eq!(vertex["subtasks"].as_array().unwrap().len(), 2);
    assert_eq!(
        vertex["subtasks"][0]["metrics"]["read-records"].as_u64().unwrap()
            + vertex["subtasks"][1]["metrics"]["read-records"].as_u64().unwrap(),
        2_000
    );

    let exceptions = client.get_ok(&format!("/jobs/{id}/exceptions"));
    assert_eq!(exceptions["exceptionHistory"]["entries"], serde_json::json!([]));
    assert_eq!(exceptions["exceptionHistory"]["truncated"], false);
    assert!(exceptions["root-exception"].is_null());
    assert_eq!(exceptions["all-exceptions"], serde_json::json!([]));

    let cluster = client.get_ok("/overview");
    assert_eq!(cluster["taskmanagers"], 1);
    assert_eq!(cluster["slots-total"], 4);
    assert_eq!(cluster["slots-available"], 4);
    assert_eq!(cluster["jobs-running"], 0);
    assert_eq!(cluster["jobs-finished"], 1);
    assert_eq!(cluster["jobs-cancelled"], 0);
    assert_eq!(cluster["jobs-failed"], 0);
    assert_eq!(cluster["flink-version"], "weir 0.1.0-test");
    assert_eq!(cluster["weir-version"], "0.1.0-test");

    let config = client.get_ok("/v1/config");
    assert_eq!(config["refresh-interval"], 3000);
    assert_eq!(config["timezone-name"], "UTC");
    assert_eq!(config["timezone-offset"], 0);
    assert_eq!(config["flink-version"], "weir 0.1.0-test");
    assert_eq!(config["features"]["web-submit"], false);
    assert_eq!(config["features"]["web-cancel"], true);
    server.shutdown();
}

#[test]
fn a_running_job_is_cancelled_over_rest() {
    let (dispatcher, server) = start(8);
    let client = Client::new(&server);
    let job = submit_endless(&dispatcher);
    let id = job.0.job_id().to_string();
    client.wait_for_state(&id, "RUNNING");

    let cluster = client.get_ok("/overview");
    assert_eq!(cluster["jobs-running"], 1);
    assert_eq!(cluster["slots-total"], 8);
    assert_eq!(cluster["slots-available"], 4, "two vertices at parallelism 2 use 4 slots");
    assert_eq!(client.get_ok(&format!("/jobs/{id}"))["end-time"], -1);

    // A stop (drained or not) needs somewhere to put its savepoint.
    let (status, body) = client.post_json(&format!("/jobs/{id}/stop"), r#"{"drain": true}"#);
    assert_error(status, &body, 409, "no savepoint directory");
    assert_eq!(client.get_ok(&format!("/jobs/{id}"))["state"], "RUNNING");

    let (status, body) = client.patch(&format!("/jobs/{id}?mode=cancel"));
    assert_eq!(status, 202, "{body}");
    assert_eq!(body, serde_json::json!({}));
    client.wait_for_state(&id, "CANCELED");

    let details = client.get_ok(&format!("/jobs/{id}"));
    assert!(details["timestamps"]["CANCELLING"].as_u64().is_some());
    assert!(details["timestamps"]["CANCELED"].as_u64().is_some());

    let (status, body) = client.patch(&format!("/v1/jobs/{id}?mode=cancel"));
    assert_error(status, &body, 409, &format!("Job {id} is already CANCELED; only running jobs can be cancelled"));
    // Flink 2's application cancel: the application of an ended job cannot be.
    let (status, body) = client.post(&format!("/applications/{id}/cancel"));
    assert_error(status, &body, 409, &format!("Application {id} is already CANCELED"));
    let (status, body) = client.post("/applications/00000000000000000000000000000000/cancel");
    assert_error(status, &body, 404, "not found");

    let cluster = client.get_ok("/overview");
    assert_eq!(cluster["jobs-running"], 0);
    assert_eq!(cluster["jobs-cancelled"], 1);
    assert_eq!(cluster["slots-available"], 8);
    server.shutdown();
}

#[test]
fn a_failed_job_shows_its_exceptions_newest_first() {
    let (dispatcher, server) = start(4);
    let client = Client::new(&server);
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..1000u64).collect()))
        .key_by(|v: &u64| *v)
        .process(FailOn(500))
        .name("validator")
        .sink_to(CollectSink::default());
    let job = EndOnDrop(dispatcher.submit(env.build("failing").unwrap(), settings(2)).unwrap());
    let id = job.0.job_id().to_string();
    client.wait_for_state(&id, "FAILED");

    let exceptions = client.get_ok(&format!("/jobs/{id}/exceptions"));
    let entries = exceptions["exceptionHistory"]["entries"].as_array().unwrap();
    assert!(!entries.is_empty());
    assert_eq!(entries[0]["exceptionName"], "UserFunctionError");
    let newest = entries[0]["stacktrace"].as_str().unwrap();
    assert!(newest.contains("refusing record 500"), "{newest}");
    assert!(entries[0]["taskName"].as_str().unwrap().contains("validator"));
    assert_eq!(entries[0]["location"], "localhost");
    let times: Vec<u64> = entries.iter().map(|e| e["timestamp"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "newest first: {times:?}");
    assert_eq!(exceptions["root-exception"], newest);
    assert_eq!(exceptions["timestamp"], times[0]);
    assert_eq!(exceptions["all-exceptions"].as_array().unwrap().len(), entries.len());

    let limited = client.get_ok(&format!("/jobs/{id}/exceptions?maxExceptions=0"));
    assert_eq!(limited["exceptionHistory"]["entries"], serde_json::json!([]));
    assert_eq!(limited["exceptionHistory"]["truncated"], true);
    assert_eq!(limited["root-exception"], newest);

    let (status, body) = client.get(&format!("/jobs/{id}/exceptions?maxExceptions=many"));
    assert_error(status, &body, 400, "maxExceptions");

    let details = client.get_ok(&format!("/jobs/{id}"));
    assert!(details["failure-cause"].as_str().unwrap().contains("refusing record 500"));
    assert_eq!(client.get_ok("/overview")["jobs-failed"], 1);
    server.shutdown();
}

#[test]
fn client_mistakes_get_flink_error_bodies() {
    let (dispatcher, server) = start(4);
    let client = Client::new(&server);
    let unknown = "0123456789abcdef0123456789abcdef";

    for path in [
        format!("/jobs/{unknown}"),
        format!("/v1/jobs/{unknown}"),
        format!("/jobs/{unknown}/status"),
        format!("/jobs/{unknown}/exceptions"),
        format!("/jobs/{unknown}/vertices/abc"),
    ] {
        let (status, body) = client.get(&path);
        assert_error(status, &body, 404, &format!("Job {unknown} not found"));
    }
    // A JobManager keeps no deployments: the answer says who does.
    let (status, body) = client.get("/deployments");
    assert_error(status, &body, 404, "ask the deployment controller (`weir operator`");
    let (status, body) = client.patch(&format!("/jobs/{unknown}?mode=cancel"));
    assert_error(status, &body, 404, &format!("Job {unknown} not found"));

    let (status, body) = client.get("/jobs/xyz");
    assert_error(status, &body, 400, "'xyz' is not a job id");
    let (status, body) = client.patch("/jobs/XYZ?mode=cancel");
    assert_error(status, &body, 400, "'XYZ' is not a job id");

    let (status, body) = client.get("/nope/such");
    assert_error(status, &body, 404, "Not found: /nope/such");
    let (status, body) = client.get("/v2/jobs");
    assert_error(status, &body, 404, "Not found: /v2/jobs");
    let (status, body) = client.post("/overview");
    assert_error(status, &body, 405, "POST");
    // An embedded cluster runs one job and accepts no submissions.
    let (status, body) = client.post_json("/jobs", r#"{"job":"counter","args":[]}"#);
    assert_error(status, &body, 405, "embedded cluster");

    let job = submit_bounded(&dispatcher);
    let id = job.0.job_id().to_string();
    client.wait_for_state(&id, "FINISHED");
    let (status, body) = client.patch(&format!("/jobs/{id}"));
    assert_error(status, &body, 400, "mode=cancel");
    let (status, body) = client.patch(&format!("/jobs/{id}?mode=stop"));
    assert_error(status, &body, 400, "mode=cancel");
    let (status, body) = client.patch(&format!("/jobs/{id}?mode=cancel"));
    assert_error(status, &body, 409, &format!("Job {id} is already FINISHED; only running jobs can be cancelled"));
    let (status, body) = client.get(&format!("/jobs/{id}/vertices/nosuchvertex"));
    assert_error(status, &body, 404, "Vertex nosuchvertex not found");
    server.shutdown();
}

/// `POST path` of a multipart upload of `size` bytes over a plain socket, as Flink's client
/// sends a JobGraph and its jars: every byte is written before the answer is read (a server
/// that answers early and closes makes the write fail), then the status and body.
fn upload(server: &RestServer, path: &str, size: usize) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut socket = std::net::TcpStream::connect(server.local_addr()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let boundary = "----flink-jobgraph";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"request\"\r\nContent-Type: application/json\r\n\r\n{{\"jobGraphFileName\":\"job.bin\",\"jobJarFileNames\":[\"job.jar\"]}}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file_0\"; filename=\"job.jar\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.resize(body.len() + size, b'j');
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).unwrap();
    for chunk in body.chunks(64 * 1024) {
        socket.write_all(chunk).expect("the server stopped reading the upload before its end");
    }
    let mut answer = String::new();
    socket.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// `flink run` posts a JobGraph and jars to `/jobs`, and scripts upload jars to
/// `/jars/upload`: weir reads the whole upload, then answers 400 (a JobGraph) or 404 (no jars) saying what to run instead
/// (a Flink client shown "Channel became inactive" retries for a minute).
#[test]
fn a_flink_program_upload_is_read_then_refused_with_what_to_do() {
    let (_dispatcher, server) = start(2);
    // A JobGraph is a bad submission (400); there are no jars to upload to or run (404).
    for (path, want) in [("/jobs", 400), ("/v1/jobs", 400), ("/jars/upload", 404), ("/jars/abc_job.jar/run", 404)] {
        let started = std::time::Instant::now();
        let (status, body) = upload(&server, path, 8 << 20);
        assert_eq!(status, want, "{path}: {body}");
        assert!(body.contains("weir runs the jobs compiled into its binary") && body.contains("weir jobs"), "{body}");
        assert!(started.elapsed() < Duration::from_secs(10), "{path} took {:?}", started.elapsed());
    }
    server.shutdown();
}

/// Flink's log paths serve the newest part of this process's log (what the logger kept),
/// the embedded TaskManager's too; a log that does not exist is a 404 saying which do.
#[test]
fn the_log_is_served_at_flinks_paths() {
    let (_dispatcher, server) = start(2);
    let client = Client::new(&server);
    weir_runtime::log_tail::append(b"2026-12-06T00:00:00Z  INFO a line the logger wrote\n");
    for path in ["/jobmanager/log", "/jobmanager/logs/jobmanager.log", "/taskmanagers/embedded/log"] {
        let (status, _, text) = get_text(&server, path);
        assert_eq!(status, 200, "{path}");
        assert!(text.contains("INFO a line the logger wrote"), "{path}: {text}");
    }
    let logs = client.get_ok("/jobmanager/logs");
    assert_eq!(logs["logs"][0]["name"], "jobmanager.log", "{logs}");
    assert!(logs["logs"][0]["size"].as_u64() > Some(0), "{logs}");
    let (status, body) = client.get("/jobmanager/logs/other.log");
    assert_error(status, &body, 404, "the JobManager has jobmanager.log");
    let (status, body) = client.get("/taskmanagers/tm-1/log");
    assert_error(status, &body, 404, "stays in its own process");
    server.shutdown();
}

#[test]
fn a_taken_port_is_reported_with_what_to_do() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let error = RestServer::start(
        "127.0.0.1",
        port,
        Dispatcher::new("localhost"),
        ClusterInfo { taskmanagers: 1, slots_total: 1, version: "0.1.0".to_string(), ..ClusterInfo::default() },
    )
    .err()
    .expect("binding a taken port fails");
    assert_eq!(
        error.to_string(),
        format!(
            "cannot bind the REST API to 127.0.0.1:{port}: address in use; is another weir or \
             Flink running? set -D rest.port=0 for any free port or choose another port"
        )
    );
}

#[test]
fn shutdown_is_prompt_and_frees_the_port() {
    let (_dispatcher, server) = start(1);
    let client = Client::new(&server);
    client.get_ok("/overview");
    let address = server.local_addr();
    let began = Instant::now();
    server.shutdown();
    assert!(began.elapsed() < Duration::from_secs(5), "shutdown took {:?}", began.elapsed());
    assert!(
        std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err(),
        "still accepting connections after shutdown"
    );
}

/// `/metrics` is Prometheus text with per-subtask record counts that add up to what the job
/// processed, and the job's state, restarts and checkpoint counters.
#[test]
fn metrics_are_prometheus_text_with_per_subtask_counts() {
    let (dispatcher, server) = start(4);
    let job = submit_bounded(&dispatcher);
    assert_eq!(job.0.wait_terminal(Some(DEADLINE)), weir_types::JobStatus::Finished);
    let jid = job.0.job_id().to_string();
    let mut response = ureq::get(format!("{}/metrics", server.url())).call().unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    let text = response.body_mut().read_to_string().unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let value = |line: &str| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
    let sum = |metric: &str, task: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(metric) && l.contains(&format!("job_id=\"{jid}\"")) && l.contains(task))
            .map(value)
            .sum()
    };
    // 2 000 records enter the keyed counter (p=2) and leave the source.
    assert_eq!(sum("weir_task_records_in_total{", "task=\"KeyedProcess"), 2_000, "{text}");
    assert_eq!(sum("weir_task_records_out_total{", "task=\"Source"), 2_000, "{text}");
    let subtask_lines = text
        .lines()
        .filter(|l| l.starts_with("weir_task_records_in_total{") && l.contains("task=\"KeyedProcess"))
        .count();
    assert_eq!(subtask_lines, 2, "one series per subtask: {text}");
    assert!(
        text.contains(&format!("weir_job_state{{job_id=\"{jid}\",job_name=\"bounded count\",state=\"FINISHED\"}} 1")),
        "{text}"
    );
    assert!(
        text.contains(&format!("weir_job_restarts_total{{job_id=\"{jid}\",job_name=\"bounded count\"}} 0")),
        "{text}"
    );
    assert!(text.contains("# TYPE weir_job_checkpoints_completed counter"), "{text}");
    // Per chained operator: the keyed counter and the sink chained to it each see every record.
    for (metric, operator) in [
        ("weir_operator_records_out_total{", "operator=\"source\""),
        ("weir_operator_records_in_total{", "operator=\"counter\""),
        ("weir_operator_records_out_total{", "operator=\"counter\""),
        ("weir_operator_records_in_total{", "operator=\"sink\""),
    ] {
        assert_eq!(sum(metric, operator), 2_000, "{metric}{operator}: {text}");
    }
    assert_eq!(sum("weir_operator_records_out_total{", "operator=\"sink\""), 0, "a sink emits nothing: {text}");
    let details: serde_json::Value = serde_json::from_str(
        &ureq::get(format!("{}/jobs/{jid}", server.url())).call().unwrap().body_mut().read_to_string().unwrap(),
    )
    .unwrap();
    let chain = &details["vertices"][1]["subtasks"][0]["operators"];
    assert_eq!(chain[0]["uid"], "counter", "{chain}");
    assert_eq!(chain[1]["uid"], "sink", "{chain}");
}

/// Fetches `path` as text: (status, content type, body).
fn get_text(server: &RestServer, path: &str) -> (u16, String, String) {
    let mut response = ureq::get(format!("{}{path}", server.url())).call().unwrap();
    let content_type = response.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    (response.status().as_u16(), content_type, response.body_mut().read_to_string().unwrap())
}

/// The Web UI's three files are served from the binary at `/`, with their content types.
#[test]
fn the_web_ui_is_served_at_the_root() {
    let (_dispatcher, server) = start(2);
    for (path, kind, marker) in [
        ("/", "text/html", "<script src=\"app.js\"></script>"),
        ("/index.html", "text/html", "<title>weir Web UI</title>"),
        ("/app.js", "text/javascript", "async function pageJob("),
        ("/app.css", "text/css", ".st-RUNNING"),
    ] {
        let (status, content_type, body) = get_text(&server, path);
        assert_eq!(status, 200, "GET {path}");
        assert!(content_type.starts_with(kind), "GET {path}: {content_type}");
        assert!(body.contains(marker), "GET {path} lacks {marker:?}");
    }
    // Every API path the UI fetches is one the server answers (relative paths from `/`).
    let (_, _, script) = get_text(&server, "/app.js");
    for used in ["api(\"overview\")", "api(\"jobs/overview\")", "api(\"config\")", "api(\"taskmanagers\")"] {
        assert!(script.contains(used), "app.js no longer calls {used}");
    }
}

/// `/openapi.json` documents exactly the routes the server has, each with its methods.
#[test]
fn openapi_documents_every_route() {
    let (_dispatcher, server) = start(2);
    let client = Client::new(&server);
    let doc = client.get_ok("/openapi.json");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{}", doc["openapi"]);
    assert_eq!(doc["info"]["title"], "weir REST API");
    let paths = doc["paths"].as_object().unwrap();
    let want: &[(&str, &[&str])] = &[
        ("/overview", &["get"]),
        ("/config", &["get"]),
        // This is an embedded cluster: it takes no submissions, and says so.
        ("/jobs", &["get"]),
        ("/jobs/overview", &["get"]),
        ("/jobmanager/config", &["get"]),
        ("/jobs/{jobid}", &["get", "patch"]),
        ("/jobs/{jobid}/config", &["get"]),
        ("/jobs/{jobid}/status", &["get"]),
        ("/jobs/{jobid}/plan", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/backpressure", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/watermarks", &["get"]),
        ("/jobs/{jobid}/exceptions", &["get"]),
        ("/jobs/{jobid}/checkpoints", &["get", "post"]),
        ("/jobs/{jobid}/checkpoints/{triggerid}", &["get"]),
        ("/jobs/{jobid}/checkpoints/details/{checkpointid}/subtasks/{vertexid}", &["get"]),
        ("/jobs/{jobid}/checkpoints/config", &["get"]),
        ("/jobs/{jobid}/savepoints", &["post"]),
        ("/jobs/{jobid}/savepoints/{triggerid}", &["get"]),
        ("/jobs/{jobid}/stop", &["post"]),
        ("/taskmanagers", &["get"]),
        ("/taskmanagers/{taskmanagerid}", &["get"]),
        ("/taskmanagers/metrics", &["get"]),
        ("/taskmanagers/{taskmanagerid}/metrics", &["get"]),
        ("/taskmanagers/{taskmanagerid}/thread-dump", &["get"]),
        ("/metrics", &["get"]),
        ("/deployments", &["get"]),
        ("/deployments/{name}", &["get"]),
        ("/jobs/{jobid}/checkpoints/details/{checkpointid}", &["get"]),
        ("/jobs/{jobid}/clientHeartbeat", &["patch"]),
        ("/savepoint-disposal", &["post"]),
        ("/savepoint-disposal/{triggerid}", &["get"]),
        ("/jobmanager/environment", &["get"]),
        ("/jobmanager/thread-dump", &["get"]),
        ("/jobmanager/metrics", &["get"]),
        ("/jobs/metrics", &["get"]),
        ("/jobs/{jobid}/metrics", &["get"]),
        ("/jobs/{jobid}/jobmanager/config", &["get"]),
        ("/jobs/{jobid}/jobmanager/environment", &["get"]),
        ("/jobs/{jobid}/accumulators", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/accumulators", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/accumulators", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/metrics", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/attempts/{attempt}", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/attempts/{attempt}/accumulators", &["get"]),
        ("/jobs/{jobid}/resource-requirements", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/metrics", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasktimes", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/taskmanagers", &["get"]),
        ("/jobs/{jobid}/vertices/{vertexid}/metrics", &["get"]),
        ("/applications/overview", &["get"]),
        ("/applications/{applicationid}", &["get"]),
        ("/applications/{applicationid}/exceptions", &["get"]),
        ("/applications/{applicationid}/jobmanager/config", &["get"]),
        ("/applications/{applicationid}/cancel", &["post"]),
        ("/jars/upload", &["post"]),
        ("/jobmanager/log", &["get"]),
        ("/jobmanager/config/effective", &["get"]),
        ("/jobmanager/stdout", &["get"]),
        ("/jobmanager/logs", &["get"]),
        ("/jobmanager/logs/{filename}", &["get"]),
        ("/taskmanagers/{taskmanagerid}/log", &["get"]),
        ("/taskmanagers/{taskmanagerid}/logs", &["get"]),
        ("/jars/{jarid}/run", &["post"]),
    ];
    let mut documented: Vec<&String> = paths.keys().collect();
    documented.sort();
    let mut expected: Vec<&str> = want.iter().map(|(p, _)| *p).collect();
    expected.sort();
    assert_eq!(documented, expected, "documented paths differ from the router's");
    assert!(paths["/jobs"]["post"].is_null(), "an embedded cluster documents POST /jobs");
    for (path, methods) in want {
        for method in *methods {
            let operation = &paths[*path][*method];
            assert!(operation.is_object(), "{method} {path} is not documented");
            assert!(operation["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path}");
        }
        // Every documented path is really served (a bad id answers 400/404, never the fallback).
        let concrete = path
            .replace("{jobid}", "00000000000000000000000000000000")
            .replace("{vertexid}", "v")
            .replace("{triggerid}", "r")
            .replace("{taskmanagerid}", "t")
            .replace("{checkpointid}", "1")
            .replace("{subtaskindex}", "0")
            .replace("{attempt}", "0")
            .replace("{applicationid}", "00000000000000000000000000000000");
        // (Text, not JSON: the metrics and the logs.)
        let text = *path == "/metrics" || path.contains("/log") || path.ends_with("/stdout");
        if methods.contains(&"get") && !text {
            let (status, body) = client.get(&concrete);
            if status == 404 {
                let message = body["errors"][0].as_str().unwrap_or_default();
                assert!(!message.starts_with("Not found:"), "GET {concrete} is not routed: {message}");
            }
        }
    }
    for schema in ["JobDetails", "CheckpointingStatistics", "ErrorResponse", "VertexBackPressure"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "schema {schema} missing");
    }
}

/// The plan, backpressure and TaskManager endpoints the job page and TaskManager page use.
#[test]
fn plan_backpressure_and_taskmanager_details_describe_a_running_job() {
    let (dispatcher, server) = start(4);
    let job = submit_endless(&dispatcher);
    let client = Client::new(&server);
    let jid = job.0.job_id().to_string();
    client.wait_for_state(&jid, "RUNNING");
    let details = client.get_ok(&format!("/jobs/{jid}"));
    let vertices = details["vertices"].as_array().unwrap();
    let plan = client.get_ok(&format!("/jobs/{jid}/plan"))["plan"].clone();
    assert_eq!(plan, details["plan"], "/plan is the job's plan");
    let nodes = plan["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), vertices.len());
    assert_eq!(plan["type"], "STREAMING");
    assert!(nodes[0]["inputs"].as_array().unwrap().is_empty(), "the source has no inputs: {plan}");
    let input = &nodes[1]["inputs"][0];
    assert_eq!(input["id"], nodes[0]["id"], "{plan}");
    assert_eq!(input["ship_strategy"], "HASH", "key_by is a hash exchange: {plan}");

    let vertex = vertices[1]["id"].as_str().unwrap();
    let pressure = client.get_ok(&format!("/jobs/{jid}/vertices/{vertex}/backpressure"));
    assert_eq!(pressure["status"], "ok");
    let subtasks = pressure["subtasks"].as_array().unwrap();
    assert_eq!(subtasks.len(), 2, "{pressure}");
    for subtask in subtasks {
        let ratio = subtask["ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&ratio), "{pressure}");
        assert!(["ok", "low", "high"].contains(&subtask["backpressure-level"].as_str().unwrap()), "{pressure}");
    }
    let (status, body) = client.get(&format!("/jobs/{jid}/vertices/nope/backpressure"));
    assert_error(status, &body, 404, "Vertex nope not found");

    let tm = client.get_ok("/taskmanagers/embedded");
    assert_eq!(tm["slotsNumber"], 4);
    let tasks = tm["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4, "2 vertices at parallelism 2: {tm}");
    assert!(tasks.iter().all(|t| t["jid"] == jid.as_str() && t["status"] == "RUNNING"), "{tm}");
    let (status, body) = client.get("/taskmanagers/nope");
    assert_error(status, &body, 404, "TaskManager nope not found");

    // Flink's TaskManager metrics are its JVM's: weir's TaskManagers have none.
    assert_eq!(client.get_ok("/taskmanagers/metrics"), serde_json::json!([]));
    assert_eq!(client.get_ok("/taskmanagers/metrics?get=Status.JVM.CPU.Load&agg=max"), serde_json::json!([]));
    assert_eq!(client.get_ok("/taskmanagers/embedded/metrics"), serde_json::json!([]));
    assert_eq!(client.get_ok("/taskmanagers/embedded/metrics?get=Status.JVM.CPU.Load"), serde_json::json!([]));
    let (status, body) = client.get("/taskmanagers/nope/metrics");
    assert_error(status, &body, 404, "TaskManager nope not found");
    // The embedded TaskManager is this process: its threads.
    let dump = client.get_ok("/taskmanagers/embedded/thread-dump");
    let threads = dump["threadInfos"].as_array().unwrap();
    assert!(!threads.is_empty(), "{dump}");
    assert!(threads.iter().all(|t| t["threadName"].is_string() && t["stringifiedThreadInfo"].is_string()), "{dump}");
    let (status, body) = client.get("/taskmanagers/nope/thread-dump");
    assert_error(status, &body, 404, "TaskManager nope not found");

    // Each vertex runs at its parallelism.
    let requirements = client.get_ok(&format!("/jobs/{jid}/resource-requirements"));
    assert_eq!(requirements.as_object().unwrap().len(), vertices.len(), "{requirements}");
    for v in vertices {
        let id = v["id"].as_str().unwrap();
        let want = serde_json::json!({"parallelism": {"lowerBound": 1, "upperBound": v["parallelism"]}});
        assert_eq!(requirements[id], want, "{requirements}");
    }
    // One attempt's accumulators: none; only the current attempt is kept.
    let attempt = client.get_ok(&format!("/jobs/{jid}/vertices/{vertex}/subtasks/1"))["attempt"].as_u64().unwrap();
    let accumulators =
        client.get_ok(&format!("/jobs/{jid}/vertices/{vertex}/subtasks/1/attempts/{attempt}/accumulators"));
    let want = serde_json::json!({"subtask": 1, "attempt": attempt, "id": format!("{vertex}_1_{attempt}"), "user-accumulators": []});
    assert_eq!(accumulators, want);
    let (status, body) =
        client.get(&format!("/jobs/{jid}/vertices/{vertex}/subtasks/1/attempts/{}/accumulators", attempt + 1));
    assert_error(status, &body, 404, "weir keeps only the current attempt");

    // Cancelling the application cancels its job.
    let (status, body) = client.post(&format!("/applications/{jid}/cancel"));
    assert_eq!(status, 202, "{body}");
    assert_eq!(body, serde_json::json!({}));
    client.wait_for_state(&jid, "CANCELED");
}

/// What the CLI passes for a secret: already masked.
fn weir_config_hidden() -> &'static str {
    "******"
}

/// `GET /jobmanager/config` and `GET /jobs/{id}/config`, as Flink shapes them.
#[test]
fn configuration_of_the_jobmanager_and_of_a_job() {
    let (dispatcher, server) = start(4);
    let client = Client::new(&server);
    let entries = client.get_ok("/jobmanager/config");
    assert_eq!(
        entries,
        serde_json::json!([{"key": "parallelism.default", "value": "2"}, {"key": "s3.secret-key", "value": "******"}])
    );
    let job = submit_endless(&dispatcher);
    let jid = job.0.job_id().to_string();
    client.wait_for_state(&jid, "RUNNING");
    let config = client.get_ok(&format!("/jobs/{jid}/config"));
    assert_eq!(config["jid"], jid.as_str());
    let execution = &config["execution-config"];
    assert_eq!(execution["job-parallelism"], 2);
    assert_eq!(execution["user-config"], serde_json::json!({}));
    assert!(execution["restart-strategy"].as_str().unwrap().starts_with("none"), "{config}");
    // Flink's clients refuse fields they do not know inside `execution-config`: weir's own
    // settings are beside it.
    assert_eq!(execution.as_object().unwrap().len(), 4, "{config}");
    let weir = &config["weir-execution-config"];
    assert_eq!(weir["execution-mode"], "PIPELINED");
    assert_eq!(weir["max-parallelism"], 128);
    assert_eq!(weir["failover-strategy"], "region");
    let (status, body) = client.get("/jobs/00000000000000000000000000000000/config");
    assert_error(status, &body, 404, "not found");
}

/// `POST /jobs/{jobid}/checkpoints` refuses what it cannot do with a message that says what
/// to do (the checkpoint itself is taken in crates/weir-cli/tests/flink_tools.rs, by `flink
/// checkpoint`).
#[test]
fn checkpoint_requests_are_refused_with_what_to_do() {
    let (dispatcher, server) = start(4);
    let client = Client::new(&server);
    let job = submit_endless(&dispatcher);
    let jid = job.0.job_id().to_string();
    client.wait_for_state(&jid, "RUNNING");
    let (status, body) = client.post(&format!("/jobs/{jid}/checkpoints"));
    assert_error(status, &body, 409, "set execution.checkpointing.interval");
    let (status, body) = client.post_json(&format!("/jobs/{jid}/checkpoints"), r#"{"checkpointType": "SOMETIMES"}"#);
    assert_error(status, &body, 400, "not one of CONFIGURED, FULL, INCREMENTAL");
    let (status, body) = client.post_json(&format!("/jobs/{jid}/checkpoints"), r#"{"triggerId": "x"}"#);
    assert_error(status, &body, 400, "32 lower-case hex");
    let (status, body) = client.get(&format!("/jobs/{jid}/checkpoints/0123456789abcdef0123456789abcdef"));
    assert_error(status, &body, 404, "POST /jobs/");
    // The static paths beside the trigger id still answer.
    client.get_ok(&format!("/jobs/{jid}/checkpoints/config"));
}
