//! The Web UI in a real browser: headless Chromium loads the pages the JobManager serves
//! while a job runs, and the rendered DOM must show the job RUNNING, its operator graph,
//! its subtasks and its checkpoints; and the pages the deployment controller (`weir
//! operator`) serves, with a deployment's lifecycle, job and savepoint history.
//!
//! Needs Chromium (`apt-get install -y chromium`; `.ci/test` installs it). `WEIR_CHROMIUM`
//! names another binary. With `WEIR_UI_SCREENSHOT_DIR=dir` the test also saves screenshots
//! of the job page and its checkpoints tab there (how `docs/web-ui-*.png` are made).

#[path = "common/browser.rs"]
mod browser;
mod common;
use common::BoundedOutput;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use browser::{BROWSER_MAX, CHROMIUM_FLAGS, chromium, headless};
use common::{RunningWeir, poll_json};

fn rendered(url: &str) -> String {
    let dom = headless(url, &["--dump-dom"]);
    assert!(dom.contains("<body"), "chromium dumped no page for {url}: {dom:?}");
    dom
}

fn screenshot(dir: &Path, name: &str, url: &str) {
    let path = dir.join(name);
    headless(url, &[&format!("--screenshot={}", path.display())]);
    assert!(path.is_file(), "no screenshot at {}", path.display());
}

#[test]
fn the_web_ui_shows_a_running_job_in_a_real_browser() {
    let checkpoints = tempfile::tempdir().unwrap();
    let checkpoints_url = format!("file://{}", checkpoints.path().display());
    let mut run = RunningWeir::start(&[
        "run",
        "-p",
        "2",
        "-D",
        "rest.port=0",
        "-D",
        "execution.checkpointing.interval=300ms",
        "-D",
        &format!("state.checkpoints.dir={checkpoints_url}"),
        "counter",
        "--enrich",
        "--users",
        "1000",
        "--rate",
        "20000",
        "--output",
        "none",
    ]);
    let rest = run.rest_url();
    let jid = run.job_id();
    poll_json(&format!("{rest}/jobs/{jid}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(2));
    let details = poll_json(&format!("{rest}/jobs/{jid}"), |d| d["state"] == "RUNNING");
    let vertex = details["vertices"][1]["id"].as_str().unwrap().to_string();

    // The overview lists the job among the running ones, with its coloured state.
    let overview = rendered(&format!("{rest}/#/overview"));
    assert!(overview.contains("data-page=\"overview\""), "the overview did not render: {overview}");
    assert!(overview.contains(&format!("href=\"#/job/{jid}\">counter</a>")), "job missing from overview: {overview}");
    assert!(overview.contains("<span class=\"state st-RUNNING\">RUNNING</span>"), "{overview}");

    // The job page: RUNNING in its heading, the operator graph, the chosen vertex's subtasks.
    let job_page = format!("{rest}/#/job/{jid}/overview?vertex={vertex}");
    let page = rendered(&job_page);
    assert!(page.contains("data-page=\"job\""), "the job page did not render: {page}");
    assert!(page.contains("<h1>counter <span class=\"state st-RUNNING\">RUNNING</span></h1>"), "{page}");
    assert!(page.contains("<svg") && page.contains("Source: source -&gt; to-event"), "no operator graph: {page}");
    assert!(page.contains("Subtasks of enrich"), "no subtask table: {page}");
    // Each running node shows its time split, as Flink's graph, from the subtask metrics.
    assert!(page.contains("Busy (max): ") && page.contains("Backpressured (max): "), "no time split: {page}");
    let split = common::get(&format!(
        "{rest}/jobs/{jid}/vertices/{vertex}/subtasks/metrics?get=busyTimeMsPerSecond,idleTimeMsPerSecond,backPressuredTimeMsPerSecond&agg=max,min"
    ))
    .json();
    let ids: Vec<&str> = split.as_array().unwrap().iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["busyTimeMsPerSecond", "idleTimeMsPerSecond", "backPressuredTimeMsPerSecond"], "{split}");
    for metric in split.as_array().unwrap() {
        let max = metric["max"].as_f64().unwrap();
        assert!((0.0..=1000.0).contains(&max), "{split}");
    }
    // The counter has no event time: its subtasks show no watermark and no late records.
    assert!(page.contains("<th>Watermark</th>") && page.contains("No Watermark"), "no watermark column: {page}");
    assert!(page.contains("Late Records"), "no late-records column: {page}");
    // The last task chains the counter and the sink: its operators are listed with their counts.
    let last = details["vertices"][2]["id"].as_str().unwrap().to_string();
    let chain_page = format!("{rest}/#/job/{jid}/overview?vertex={last}");
    let page = rendered(&chain_page);
    assert!(page.contains("Chained operators of counter -&gt; Sink: sink"), "no chained operators: {page}");
    assert!(
        page.contains("<td class=\"mono\">counter</td>") && page.contains("<td class=\"mono\">sink</td>"),
        "{page}"
    );
    assert!(page.contains("Stop with Savepoint") && page.contains("Cancel Job"), "no actions: {page}");

    // The checkpoints tab: counts, the chart, and completed checkpoints in the history.
    let checkpoints_page = format!("{rest}/#/job/{jid}/checkpoints");
    let page = rendered(&checkpoints_page);
    assert!(page.contains("Duration and size over time") && page.contains("class=\"chart\""), "{page}");
    assert!(page.contains("<span class=\"state st-COMPLETED\">COMPLETED</span>"), "no completed checkpoint: {page}");
    assert!(page.contains(&checkpoints_url), "checkpoint storage not shown: {page}");
    // One checkpoint opened: its part per task and per subtask.
    let completed =
        common::get(&format!("{rest}/jobs/{jid}/checkpoints")).json()["latest"]["completed"]["id"].as_u64().unwrap();
    let page = rendered(&format!("{rest}/#/job/{jid}/checkpoints?checkpoint={completed}"));
    assert!(
        page.contains("id=\"checkpoint-breakdown\"") && page.contains(&format!("Checkpoint {completed} ")),
        "{page}"
    );
    assert!(
        page.contains("<b>enrich</b>") && page.contains("<th class=\"num\">Subtask</th>"),
        "no per-task rows: {page}"
    );
    assert!(page.contains("State by operator uid") && page.contains("<td class=\"mono\">counter</td>"), "{page}");

    // The job's configuration tab and the JobManager's configuration.
    let page = rendered(&format!("{rest}/#/job/{jid}/configuration"));
    assert!(page.contains("Execution Configuration") && page.contains("Restart Strategy"), "{page}");
    let page = rendered(&format!("{rest}/#/jobmanager"));
    assert!(page.contains("execution.checkpointing.interval") && page.contains("300ms"), "{page}");
    // The effective configuration: the defaults too, marked as such, and the log panel.
    assert!(
        page.contains("<td class=\"mono\">restart-strategy.type</td>") && page.contains("<td>default</td>"),
        "{page}"
    );
    assert!(page.contains("id=\"jobmanager-log\""), "no log panel: {page}");

    // The TaskManager page lists the job's subtasks.
    let page = rendered(&format!("{rest}/#/taskmanager/embedded"));
    assert!(page.contains("Subtasks on this TaskManager") && page.contains("enrich"), "{page}");

    if let Some(dir) = std::env::var_os("WEIR_UI_SCREENSHOT_DIR") {
        let dir = PathBuf::from(dir);
        screenshot(&dir, "web-ui-job.png", &chain_page);
        screenshot(&dir, "web-ui-checkpoints.png", &checkpoints_page);
    }
    run.kill_hard();
}

/// The operator's Web UI (`weir operator`): the deployments page lists a deployment with its
/// lifecycle, job state and mode, and the deployment's page shows its job (linked to its own
/// cluster's Web UI), reconciliation, savepoint history and events; an upgrade the pre-flight
/// refuses shows as refused there, in `weir deployment get` and in `weir deployment events`.
#[test]
fn the_operator_web_ui_shows_a_deployment_its_status_savepoint_history_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let operator_data = data.clone();
    let mut operator = RunningWeir::start_with(
        move |mut command| {
            command.env("WEIR_DATA_DIR", &operator_data);
            command
        },
        &["operator", "-D", "operator.rest.port=0"],
    );
    let line = operator.stderr_line("REST API and Web UI at ");
    let rest = line.split("REST API and Web UI at ").nth(1).unwrap().trim().to_string();
    let spec = format!(
        "apiVersion: weir.dev/v1\nkind: WeirDeployment\nmetadata:\n  name: orders\nspec:\n  binary: {}\n  configuration:\n    execution.checkpointing.interval: 300ms\n  taskManager:\n    replicas: 1\n    slots: 2\n  job:\n    name: counter\n    args: [--users, \"100\", --rate, \"200\", --output, none{{enrich}}]\n    parallelism: 2\n    upgradeMode: savepoint\n    savepointTriggerNonce: 1\n",
        env!("CARGO_BIN_EXE_weir")
    );
    let file = dir.path().join("orders.yaml");
    let apply = |enrich: &str| {
        std::fs::write(&file, spec.replace("{enrich}", enrich)).unwrap();
        let applied = common::weir()
            .env("WEIR_DATA_DIR", &data)
            .args(["deployment", "apply", "-f"])
            .arg(&file)
            .bounded_output()
            .unwrap();
        assert!(applied.status.success(), "{applied:?}");
    };
    apply(", --enrich");
    let deployment = poll_json(&format!("{rest}/deployments/orders"), |d| {
        d["status"]["lifecycleState"] == "STABLE"
            && d["status"]["savepointHistory"]
                .as_array()
                .is_some_and(|h| h.iter().any(|r| r["triggerType"] == "MANUAL"))
    });
    let job_id = deployment["status"]["jobStatus"]["jobId"].as_str().unwrap().to_string();
    let cluster = deployment["status"]["clusterInfo"]["restAddress"].as_str().unwrap().to_string();
    let savepoint = deployment["status"]["savepointHistory"][0]["location"].as_str().unwrap().to_string();

    let page = rendered(&format!("{rest}/#/deployments"));
    assert!(page.contains("data-page=\"deployments\""), "the deployments page did not render: {page}");
    assert!(page.contains("<a href=\"#/deployment/orders\">orders</a>"), "deployment missing: {page}");
    assert!(page.contains("<span class=\"state st-RUNNING\">STABLE</span>"), "no lifecycle: {page}");
    assert!(page.contains("<span class=\"state st-RUNNING\">RUNNING</span>"), "no job state: {page}");
    assert!(page.contains("counter <span class=\"muted\">p=2</span>") && page.contains("<td>savepoint</td>"), "{page}");

    let page = rendered(&format!("{rest}/#/deployment/orders"));
    assert!(page.contains("data-page=\"deployment\""), "the deployment page did not render: {page}");
    assert!(page.contains(&format!("href=\"{cluster}/#/job/{job_id}\"")), "no link to the cluster's job: {page}");
    assert!(page.contains("<h2>Reconciliation</h2>") && page.contains("Last stable spec"), "{page}");
    assert!(page.contains("<h2>Savepoint history</h2>") && page.contains(&savepoint), "no history: {page}");
    assert!(page.contains("<span class=\"state st-MANUAL\">MANUAL</span>"), "no trigger type: {page}");

    // An upgrade that drops the enrich operator's state is refused by the pre-flight: the
    // listing, the description, the events and the page say so, and the job runs on.
    apply("");
    poll_json(&format!("{rest}/deployments/orders"), |d| d["status"]["refusedGeneration"] == 2);
    let weir = |args: &[&str]| {
        let output = common::weir().env("WEIR_DATA_DIR", &data).args(args).bounded_output().unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    let listed = weir(&["deployment", "get"]);
    assert!(listed.contains("STABLE") && listed.contains("2/2 (2 refused)"), "{listed}");
    let described = weir(&["deployment", "get", "orders"]);
    assert!(described.contains("Refused:          generation 2: counter"), "{described}");
    assert!(described.contains("--output none --enrich (parallelism 2"), "the running spec is not shown: {described}");
    let events = weir(&["deployment", "events", "orders"]);
    for needle in ["Normal   ClusterStarted", "Normal   SavepointCompleted", "Warning  Refused"] {
        assert!(events.contains(needle), "no '{needle}' in the events:\n{events}");
    }
    assert!(events.contains("enrich"), "the refusal does not name the operator:\n{events}");
    let page = rendered(&format!("{rest}/#/deployment/orders"));
    assert!(page.contains("2 refused"), "the page does not show the refusal: {page}");
    assert!(page.contains("<h2>Events</h2>") && page.contains("<td>Refused</td>"), "no events on the page: {page}");

    if let Some(screenshots) = std::env::var_os("WEIR_UI_SCREENSHOT_DIR") {
        screenshot(&PathBuf::from(screenshots), "web-ui-deployment.png", &format!("{rest}/#/deployment/orders"));
    }
    let deleted =
        common::weir().env("WEIR_DATA_DIR", &data).args(["deployment", "delete", "orders"]).bounded_output().unwrap();
    assert!(deleted.status.success(), "{deleted:?}");
    operator.kill_hard();
    // Whatever the delete left of the deployment's cluster.
    common::kill_processes_naming(&data);
}

/// Headless Chromium driven over the DevTools protocol: navigate, evaluate, click.
struct Browser {
    child: std::process::Child,
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(chromium())
            .args(CHROMIUM_FLAGS)
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium starts");
        // Chromium writes its DevTools port into the profile once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + BROWSER_MAX;
        let port = loop {
            if let Some(port) =
                std::fs::read_to_string(&port_file).ok().and_then(|t| t.lines().next()?.parse::<u16>().ok())
            {
                break port;
            }
            assert!(Instant::now() < deadline, "chromium did not open its DevTools port");
            std::thread::sleep(Duration::from_millis(50));
        };
        let targets = common::poll_json(&format!("http://127.0.0.1:{port}/json/list"), |t| {
            t.as_array().is_some_and(|list| list.iter().any(|t| t["type"] == "page"))
        });
        let page = targets.as_array().unwrap().iter().find(|t| t["type"] == "page").unwrap();
        let url = page["webSocketDebuggerUrl"].as_str().unwrap().to_string();
        let (socket, _) = tungstenite::connect(url.as_str()).expect("DevTools websocket");
        Browser { child, socket, next_id: 0, _profile: profile }
    }

    /// Sends one DevTools command and returns its result.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = serde_json::json!({"id": id, "method": method, "params": params});
        self.socket.send(tungstenite::Message::text(request.to_string())).unwrap();
        loop {
            let message = self.socket.read().expect("DevTools answers");
            let Ok(text) = message.to_text() else { continue };
            let Ok(answer) = serde_json::from_str::<serde_json::Value>(text) else { continue };
            if answer["id"] == id {
                assert!(answer["error"].is_null(), "{method} failed: {answer}");
                return answer["result"].clone();
            }
        }
    }

    fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", serde_json::json!({ "url": url }));
    }

    /// Evaluates `expression` in the page; its value as JSON.
    fn eval(&mut self, expression: &str) -> serde_json::Value {
        let result = self.call(
            "Runtime.evaluate",
            serde_json::json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(result["exceptionDetails"].is_null(), "{expression} threw: {result}");
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy in the page.
    fn wait_for(&mut self, expression: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // While the page loads, `document.body` may not exist yet: that is "not yet".
            let value =
                self.eval(&format!("(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"));
            if value == true {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the page never satisfied {expression}; it shows: {}",
                self.eval(
                    "document.getElementById('view').innerText + ' | ' + document.getElementById('modal').innerText"
                )
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the dialog's confirm button, checking its label.
    fn confirm(&mut self, label: &str) {
        let clicked = self.eval(&format!(
            "(() => {{ const b = document.getElementById('modal-confirm'); if (b.textContent !== {label:?} || b.hidden) return b.textContent; b.click(); return true; }})()"
        ));
        assert_eq!(clicked, true, "the dialog's button is not '{label}'");
    }

    /// Clicks the first button whose text is `label`.
    fn click(&mut self, label: &str) {
        let clicked = self.eval(&format!(
            "(() => {{ const b = [...document.querySelectorAll('button')].find(b => b.textContent.trim() === {label:?} && !b.hidden); if (b) b.click(); return !!b; }})()"
        ));
        assert_eq!(clicked, true, "no button '{label}'");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The job page's actions, clicked in a real browser: a savepoint into a directory typed into
/// the dialog lands on disk, and Cancel Job asks first and then cancels.
#[test]
fn the_web_ui_actions_take_a_savepoint_and_cancel_after_confirmation() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunningWeir::start(&[
        "run",
        "-p",
        "2",
        "-D",
        "rest.port=0",
        "counter",
        "--users",
        "100",
        "--rate",
        "5000",
        "--output",
        "none",
    ]);
    let rest = run.rest_url();
    let jid = run.job_id();
    poll_json(&format!("{rest}/jobs/{jid}"), |d| {
        d["state"] == "RUNNING"
            && d["vertices"].as_array().is_some_and(|vs| vs.iter().all(|v| v["status"] == "RUNNING"))
    });
    let mut browser = Browser::start();
    browser.navigate(&format!("{rest}/#/job/{jid}/overview"));
    browser.wait_for("document.body.dataset.page === 'job' && document.querySelector('.actions')");

    // Trigger Savepoint: a dialog with a target directory; the path written is reported.
    browser.click("Trigger Savepoint");
    browser.wait_for("!document.getElementById('modal').hidden");
    let target = dir.path().join("savepoints");
    browser.eval(&format!("document.getElementById('target-dir').value = {:?}", target.display().to_string()));
    browser.confirm("Trigger Savepoint");
    browser.wait_for("document.getElementById('modal-body').innerText.includes('Savepoint written to')");
    let text = browser.eval("document.getElementById('modal-body').innerText").as_str().unwrap().to_string();
    let location = text.split("Savepoint written to ").nth(1).unwrap().trim().to_string();
    let path = PathBuf::from(location.trim_start_matches("file://"));
    assert!(path.starts_with(&target) && path.join("_metadata").is_file(), "{location}: {text}");
    browser.click("Close");
    browser.wait_for("document.getElementById('modal').hidden");

    // Cancel Job asks first: nothing happens until the dialog is confirmed.
    browser.click("Cancel Job");
    browser.wait_for("!document.getElementById('modal').hidden");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(common::get(&format!("{rest}/jobs/{jid}/status")).json()["status"], "RUNNING");
    browser.confirm("Cancel Job");
    browser.wait_for("document.getElementById('modal-body').innerText.includes('Cancel requested')");
    assert_eq!(run.wait(), Some(1), "a cancelled run exits 1");
    assert!(run.stdout_lines().iter().any(|l| l.contains("ended with state CANCELED")), "{:?}", run.stdout_lines());
}
