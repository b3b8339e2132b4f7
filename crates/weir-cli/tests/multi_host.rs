//! weir across hosts of the multi-host test bed.

mod common;
#[path = "common/hosts.rs"]
mod hosts;
#[path = "common/netns.rs"]
mod netns;

use std::time::Duration;

use hosts::{HostCluster, Layout};

#[test]
fn explore() {
    let cluster = HostCluster::start(Layout::spread(2, 3, 0), &[]);
    let out = cluster.output("out");
    let job = cluster.submit(&["-p", "2", "counter", "--users", "20", "--events", "20000", "--rate", "4000", "--output", out.to_str().unwrap()]);
    let took = cluster.wait_running(&job, Duration::from_secs(30));
    eprintln!("running after {took:?}");
    eprintln!("{}", serde_json::to_string_pretty(&cluster.get("/taskmanagers").unwrap()).unwrap());
    eprintln!("{:?}", cluster.leader());
    cluster.wait_finished(&job, Duration::from_secs(60));
    common::assert_counts_exactly_once(&common::committed_lines(&out), 20, 20000);
    eprintln!("{}", cluster.tails(10));
}
