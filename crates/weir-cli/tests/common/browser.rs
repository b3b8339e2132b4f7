//! Headless Chromium for the tests that look at a page as a user does: weir's Web UI, and
//! Apache Flink's own dashboard in front of weir's REST API.
//!
//! Needs Chromium (`apt-get install -y chromium`; `.ci/test` installs it). `WEIR_CHROMIUM`
//! names another binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest one browser run may take (it normally takes 1-3 s).
pub const BROWSER_MAX: Duration = Duration::from_secs(60);

/// Headless, as root in a container, nothing fetched in the background, a fixed window.
pub const CHROMIUM_FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1400,1000",
];

pub fn chromium() -> PathBuf {
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
         (.ci/test does) or set WEIR_CHROMIUM to a Chrome/Chromium binary"
    );
}

/// Runs headless Chromium on `url` with `extra` arguments (`--dump-dom` or `--screenshot`);
/// returns its stdout. The page gets a virtual time budget, so its first render and a few
/// refreshes complete before Chromium dumps or shoots it.
pub fn headless(url: &str, extra: &[&str]) -> String {
    headless_with_budget(url, 4000, extra)
}

/// [`headless`] with a virtual time budget of `budget_ms`: a page whose values arrive from
/// requests it sends after its first render (Flink's dashboard fills in each vertex's
/// metrics so) needs a few of its refreshes inside the budget, or a dump taken while those
/// requests are in flight shows their placeholders.
pub fn headless_with_budget(url: &str, budget_ms: u32, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium())
        .args(CHROMIUM_FLAGS)
        .arg("--hide-scrollbars")
        .arg(format!("--virtual-time-budget={budget_ms}"))
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
