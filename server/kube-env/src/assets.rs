//! Finds the control plane's binaries: a directory named by `GANGWAY_K8S_ASSETS`
//! (or, when unset, the team's shared `../shared/k8s` beside the repository) holding
//! either the programs themselves or their `.xz` files. Compressed ones are
//! decompressed once into a cache directory (`GANGWAY_K8S_CACHE`, default a folder
//! under the system temp dir) and checked against the folder's `SHA256SUMS`; the
//! cache is filled through a scratch folder renamed into place, so concurrent test
//! binaries never see half-written programs.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::EnvError;

/// The environment variable naming the assets directory.
pub const ASSETS_ENV: &str = "GANGWAY_K8S_ASSETS";
/// The environment variable naming the decompression cache.
pub const CACHE_ENV: &str = "GANGWAY_K8S_CACHE";
/// The programs a control plane needs.
pub const PROGRAMS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// Where the runnable programs are.
#[derive(Debug, Clone)]
pub struct Assets {
    dir: PathBuf,
}

impl Assets {
    /// Locates the assets (decompressing them into the cache if needed).
    pub fn locate() -> Result<Self, EnvError> {
        let source = source_dir()?;
        if PROGRAMS.iter().all(|p| is_file(&source.join(p))) {
            return Ok(Self { dir: source });
        }
        if !PROGRAMS
            .iter()
            .all(|p| is_file(&source.join(format!("{p}.xz"))))
        {
            return Err(EnvError::Assets(format!(
                "{} holds neither {PROGRAMS:?} nor their .xz files; set {ASSETS_ENV} to the \
                 control plane's directory (see README: Kubernetes tests)",
                source.display()
            )));
        }
        let sums = std::fs::read_to_string(source.join("SHA256SUMS")).unwrap_or_default();
        let cache = cache_root().join(format!("k8s-{}", &hex_sha(sums.as_bytes())[..12]));
        if !cache.join(".complete").is_file() {
            decompress_into(&source, &cache, &sums)?;
        }
        Ok(Self { dir: cache })
    }

    /// The path of one program.
    pub fn program(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn is_file(path: &Path) -> bool {
    path.is_file()
}

fn source_dir() -> Result<PathBuf, EnvError> {
    if let Some(dir) = std::env::var_os(ASSETS_ENV) {
        return Ok(PathBuf::from(dir));
    }
    // The repository root is two levels above this crate.
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/k8s");
    if shared.is_dir() {
        return Ok(shared);
    }
    Err(EnvError::Assets(format!(
        "{ASSETS_ENV} is not set and {} does not exist; set it to a directory holding \
         {PROGRAMS:?} (or their .xz files)",
        shared.display()
    )))
}

fn cache_root() -> PathBuf {
    std::env::var_os(CACHE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("gangway-k8s-cache"))
}

fn hex_sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn decompress_into(source: &Path, cache: &Path, sums: &str) -> Result<(), EnvError> {
    let parent = cache
        .parent()
        .ok_or_else(|| EnvError::Assets(format!("cache path {} has no parent", cache.display())))?;
    std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    let scratch = tempfile::Builder::new()
        .prefix(".k8s-scratch-")
        .tempdir_in(parent)
        .map_err(|e| io(parent, e))?;
    for program in PROGRAMS {
        let out = scratch.path().join(program);
        let file = std::fs::File::create(&out).map_err(|e| io(&out, e))?;
        let status = Command::new("xz")
            .arg("-dc")
            .arg(source.join(format!("{program}.xz")))
            .stdout(file)
            .status()
            .map_err(|e| EnvError::Assets(format!("running xz (install xz-utils): {e}")))?;
        if !status.success() {
            return Err(EnvError::Assets(format!("xz -dc {program}.xz: {status}")));
        }
        check_sum(&out, program, sums)?;
        make_executable(&out)?;
    }
    std::fs::write(scratch.path().join(".complete"), b"").map_err(|e| io(scratch.path(), e))?;
    let kept = scratch.keep();
    if std::fs::rename(&kept, cache).is_err() {
        // Another process filled the cache first; its copy is as good as ours.
        let _ = std::fs::remove_dir_all(&kept);
        if !cache.join(".complete").is_file() {
            return Err(EnvError::Assets(format!(
                "could not fill the cache {}",
                cache.display()
            )));
        }
    }
    Ok(())
}

fn check_sum(path: &Path, program: &str, sums: &str) -> Result<(), EnvError> {
    let Some(expected) = sums.lines().find_map(|l| {
        let mut parts = l.split_whitespace();
        let sum = parts.next()?;
        (parts.next()? == program).then(|| sum.to_string())
    }) else {
        return Ok(());
    };
    let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
    let actual = hex_sha(&bytes);
    if actual != expected {
        return Err(EnvError::Assets(format!(
            "{program}: sha256 {actual}, SHA256SUMS says {expected}"
        )));
    }
    Ok(())
}

fn make_executable(path: &Path) -> Result<(), EnvError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|e| io(path, e))
}

fn io(path: &Path, e: std::io::Error) -> EnvError {
    EnvError::Io(format!("{}: {e}", path.display()))
}
