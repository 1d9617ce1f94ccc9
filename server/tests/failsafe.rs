//! Replicas that fail safe, as real `gangway serve` processes on 127.0.0.1: a
//! replica whose disk fills exits non-zero (its supervisor restarts it) instead of
//! serving with stopped Raft groups, and comes back with equal state once the disk
//! has room.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gangway_proto::v1::RegisterNodeRequest;
use support::{list_names, node, Cluster};

/// Size of the filesystem the test makes for one replica's data dir.
const SMALL_FS_MB: u64 = 48;
/// Time the replica with the full disk may take to notice and exit.
const DISK_FULL_EXIT_MS: u64 = 60_000;

/// A tmpfs mounted for the test, unmounted when dropped. Needs root (as CI runs).
struct SmallFs {
    at: PathBuf,
}

impl SmallFs {
    fn mount(at: &Path, size_mb: u64) -> SmallFs {
        std::fs::create_dir_all(at).expect("create the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a {size_mb} MiB tmpfs and needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs { at: at.to_path_buf() }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Fills the filesystem holding `dir` with a file, leaving about `leave_kb` free.
fn fill(dir: &Path, leave_kb: u64) -> PathBuf {
    let path = dir.join("filler");
    let out = Command::new("df")
        .args(["--output=avail", "-k"])
        .arg(dir)
        .output()
        .expect("run df");
    let text = String::from_utf8_lossy(&out.stdout);
    let avail_kb: u64 = text
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df output: {text}"));
    let bytes = avail_kb.saturating_sub(leave_kb) * 1024;
    let f = std::fs::File::create(&path).expect("create the filler");
    f.set_len(bytes).expect("size the filler");
    // tmpfs allocates on write: write it for real.
    let status = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "conv=notrunc,fsync"])
        .arg(format!("of={}", path.display()))
        .arg(format!("count={}", bytes / (1024 * 1024)))
        .status()
        .expect("run dd");
    assert!(status.success(), "dd filled {}", path.display());
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_replica_and_freed_space_brings_it_back() {
    let mut c = Cluster::prepare(3, 1, Vec::new(), Vec::new());
    let data3 = c.procs[&3].data.clone();
    let _fs = SmallFs::mount(&data3, SMALL_FS_MB);
    for id in 1..=3 {
        c.spawn(id);
    }
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;

    let filler = fill(&data3, 256);
    let mut inv = c.inventory(1).await;
    let mut acked = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(DISK_FULL_EXIT_MS);
    let status = loop {
        if let Some(status) = c.exited(3) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "replica 3 still runs with a full disk after {DISK_FULL_EXIT_MS} ms:\n{}",
            c.log(3)
        );
        let name = format!("n-{:05}", acked.len());
        let mut spec = node(&name);
        // Large labels fill the log quickly.
        spec.labels
            .insert("padding".into(), "x".repeat(60));
        for i in 0..40 {
            spec.labels.insert(format!("pad-{i}"), "y".repeat(60));
        }
        inv.register_node(RegisterNodeRequest { node: Some(spec) })
            .await
            .unwrap_or_else(|e| panic!("register {name} with one replica's disk full: {e}"));
        acked.push(name);
    };
    let log = c.log(3);
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    eprintln!(
        "replica 3 exited ({status}) after {} registrations, {} ERROR lines: {:#?}",
        acked.len(),
        errors.len(),
        errors.iter().take(5).collect::<Vec<_>>()
    );
    assert!(!status.success(), "exit status {status}");
    assert!(log.contains("No space left on device"), "{log}");
    assert!(log.contains("exits so that its supervisor restarts it"), "{log}");

    // The other two carry on; with room again, a restart catches up to equal state.
    support::register(&mut inv, "after-full").await.expect("register on the majority");
    acked.push("after-full".into());
    std::fs::remove_file(&filler).expect("free the space");
    c.spawn(3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    c.wait_converged(&[1, 2, 3], Duration::from_secs(30)).await;
    let mut inv3 = c.inventory(3).await;
    let listed = list_names(&mut inv3).await;
    for name in &acked {
        assert!(listed.contains(name), "{name} missing on the restarted replica");
    }
}
