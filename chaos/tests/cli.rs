//! `gangway-chaos` as an operator runs it: drills that cannot start say why in
//! one line and leave no process behind, and the checker catches a
//! deliberately wrong coordinator. Each run is bounded by the drill's own
//! timeouts; the gangway binary is the workspace's `target/<profile>/gangway`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn chaos() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gangway-chaos"))
}

fn gangway() -> PathBuf {
    let chaos = PathBuf::from(env!("CARGO_BIN_EXE_gangway-chaos"));
    chaos.with_file_name("gangway")
}

/// Processes whose command line mentions `needle` (scans /proc).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) {
            out.push(format!("{pid}: {text}"));
        }
    }
    out
}

fn run(args: &[&str], work: &Path) -> Output {
    chaos()
        .args(["run", "--drill", "leader-kill", "--duration", "2s"])
        .arg("--work-dir")
        .arg(work)
        .args(args)
        .output()
        .expect("run gangway-chaos")
}

fn assert_cannot_start(out: &Output, why: &str, work: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let replay = format!(
        "stdout: {}\nstderr: {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(2), "{replay}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {replay}");
    assert!(
        lines[0].contains("cannot start drill leader-kill"),
        "{replay}"
    );
    assert!(lines[0].contains(why), "{why:?} not said: {replay}");
    let left = processes_mentioning(&work.display().to_string());
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn a_drill_that_cannot_start_says_why_in_one_line_and_leaves_no_process() {
    let tmp = tempfile::tempdir().expect("tempdir");

    let work = tmp.path().join("missing-binary");
    let out = run(&["--gangway", "/nonexistent/gangway"], &work);
    assert_cannot_start(&out, "/nonexistent/gangway", &work);

    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let work = tmp.path().join("port-taken");
    let g = gangway();
    let out = run(
        &["--base-port", &port, "--gangway", &g.to_string_lossy()],
        &work,
    );
    assert_cannot_start(&out, &format!("port {port}"), &work);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already in use"));
    drop(taken);

    // A path below a regular file cannot be a directory, even for root.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").expect("write");
    let work = file.join("sub");
    let out = run(&["--gangway", &g.to_string_lossy()], &work);
    assert_cannot_start(&out, "not writable", &work);

    // A binary that exits at once: the replicas already started are cleaned up.
    let work = tmp.path().join("exits");
    let out = run(&["--gangway", "/bin/false"], &work);
    assert_cannot_start(&out, "exited while starting", &work);
}

#[test]
fn the_checker_catches_a_coordinator_that_skips_writing_its_decision() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let g = gangway();
    let out = chaos()
        .args([
            "self-test",
            "--drill",
            "leader-kill",
            "--duration",
            "3s",
            "--seed",
            "11",
            "--bug",
            "coordinator-skips-decision",
        ])
        .arg("--gangway")
        .arg(&g)
        .arg("--work-dir")
        .arg(tmp.path())
        .output()
        .expect("run gangway-chaos self-test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let replay = format!(
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{replay}");
    assert!(stdout.contains("self-test passed"), "{replay}");
    assert!(stdout.contains("VIOLATION I3"), "{replay}");
    assert!(stdout.contains("seed 11"), "{replay}");
    // A seed whose faults miss the bug's window is followed by the next (up to 3): the
    // replay line names the seed that caught it.
    assert!(
        stdout.lines().any(
            |l| l.contains("replay: gangway-chaos run --drill leader-kill --seed ")
                && l.contains("--bug coordinator-skips-decision")
        ),
        "{replay}"
    );
    let left = processes_mentioning(&tmp.path().display().to_string());
    assert!(left.is_empty(), "processes left behind: {left:?}");
}
