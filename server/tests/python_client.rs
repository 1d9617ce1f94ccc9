//! The Python client (`client/python`) against three real `gangway serve` processes: this
//! starts them (two shards, nodes registered) and runs the package's unittest suite with
//! their addresses and process ids; the suite submits, watches to Placed, releases, and
//! kills the replica a watch is on to see it resume on another with no change missed or
//! repeated. The package must be installed (`./test.sh` does it: `pip install
//! ./client/python`); `GANGWAY_PYTHON` names the interpreter (default `python3`).

mod support;

use std::process::Command;
use std::time::Duration;

use support::gangs::fleet;
use support::{client, Cluster};

/// The longest the Python suite may run.
const SUITE_TIMEOUT_S: u64 = 180;

fn python() -> String {
    std::env::var("GANGWAY_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_submits_watches_and_resumes_across_replicas() {
    let installed = Command::new(python())
        .args(["-c", "import gangway_client"])
        .output()
        .expect("a Python interpreter (GANGWAY_PYTHON, or python3 on PATH)");
    assert!(
        installed.status.success(),
        "the Python client is not installed: run ./test.sh, or pip install ./client/python\n{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    fleet(&client(&c, 1).await, 2, 2, "4").await;

    let ids = [1u64, 2, 3];
    let endpoints: Vec<String> = ids
        .iter()
        .map(|id| format!("http://{}", c.procs[id].grpc))
        .collect();
    let pids: Vec<String> = ids.iter().map(|id| c.pid(*id).to_string()).collect();
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../client/python/tests");
    let mut cmd = tokio::process::Command::new(python());
    cmd.args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(&tests)
        .env("GANGWAY_ENDPOINTS", endpoints.join(","))
        .env("GANGWAY_PIDS", pids.join(","))
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(SUITE_TIMEOUT_S), cmd.output())
        .await
        .expect("the Python suite ends in time")
        .expect("the Python suite runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Python suite failed (rerun: GANGWAY_ENDPOINTS=… GANGWAY_PIDS=… {} -m unittest discover -s {}):\n{report}",
        python(),
        tests.display()
    );
    assert!(!report.contains("skipped"), "every test ran: {report}");
}
