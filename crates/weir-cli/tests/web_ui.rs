//! The Web UI in a real browser: headless Chromium loads the pages the JobManager serves
//! while a job runs, and the rendered DOM must show the job RUNNING, its operator graph,
//! its subtasks and its checkpoints.
//!
//! Needs Chromium (`apt-get install -y chromium`; `.ci/run` installs it). `WEIR_CHROMIUM`
//! names another binary. With `WEIR_UI_SCREENSHOT_DIR=dir` the test also saves screenshots
//! of the job page and its checkpoints tab there (how `docs/web-ui-*.png` are made).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{RunningWeir, poll_json};

/// Longest one browser run may take (it normally takes 1-3 s).
const BROWSER_MAX: Duration = Duration::from_secs(60);

fn chromium() -> PathBuf {
    if let Ok(path) = std::env::var("WEIR_CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "the Web UI test needs Chromium: install it with `apt-get install -y chromium` \
         (.ci/run does) or set WEIR_CHROMIUM to a Chrome/Chromium binary"
    );
}

/// Runs headless Chromium on `url` with `extra` arguments (`--dump-dom` or `--screenshot`);
/// returns its stdout. The page gets a virtual time budget, so its first render and a few
/// refreshes complete before Chromium dumps or shoots it.
fn headless(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
            "--hide-scrollbars",
            "--virtual-time-budget=4000",
            "--window-size=1400,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
    let deadline = Instant::now() + BROWSER_MAX;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish {url} within {BROWSER_MAX:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

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
    assert!(page.contains("Stop with Savepoint") && page.contains("Cancel Job"), "no actions: {page}");

    // The checkpoints tab: counts, the chart, and completed checkpoints in the history.
    let checkpoints_page = format!("{rest}/#/job/{jid}/checkpoints");
    let page = rendered(&checkpoints_page);
    assert!(page.contains("Duration and size over time") && page.contains("class=\"chart\""), "{page}");
    assert!(page.contains("<span class=\"state st-COMPLETED\">COMPLETED</span>"), "no completed checkpoint: {page}");
    assert!(page.contains(&checkpoints_url), "checkpoint storage not shown: {page}");

    // The TaskManager page lists the job's subtasks.
    let page = rendered(&format!("{rest}/#/taskmanager/embedded"));
    assert!(page.contains("Subtasks on this TaskManager") && page.contains("enrich"), "{page}");

    if let Some(dir) = std::env::var_os("WEIR_UI_SCREENSHOT_DIR") {
        let dir = PathBuf::from(dir);
        screenshot(&dir, "web-ui-job.png", &job_page);
        screenshot(&dir, "web-ui-checkpoints.png", &checkpoints_page);
    }
    run.kill_hard();
}
