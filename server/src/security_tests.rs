//! Unit tests of `security.rs`.

use super::*;

#[test]
fn tokens_are_checked_by_digest_and_an_empty_file_names_its_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens");
    std::fs::write(&path, "# operators\nalpha-123\n\nbeta-456\n").expect("write");
    let tokens = Tokens::load(path.clone()).expect("tokens");
    assert_eq!(tokens.own(), "alpha-123");
    assert!(tokens.accepts("beta-456") && !tokens.accepts("gamma"));
    assert!(
        tokens.secrets().is_empty(),
        "client tokens are kept as digests only"
    );
    std::fs::write(&path, "\n# nothing\n").expect("write");
    let err = read_tokens(TOKENS_FLAG, &path).expect_err("empty");
    assert!(err.to_string().contains("--auth-tokens-file"));
}

fn write_pki(dir: &Path, name: &str) -> TlsFiles {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("cert");
    let files = TlsFiles {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}-key.pem")),
        client_ca: dir.join(format!("{name}-ca.pem")),
    };
    std::fs::write(&files.cert, cert.pem()).expect("write");
    std::fs::write(&files.key, key.serialize_pem()).expect("write");
    std::fs::write(&files.client_ca, issuer.as_ref().pem()).expect("write");
    files
}

#[test]
fn changed_tls_files_are_reloaded_and_broken_ones_keep_the_last_good() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = write_pki(dir.path(), "a");
    let tls = ServerTls::load(files.clone()).expect("load");
    let first = tls.current();
    tls.reload_if_changed();
    assert!(
        Arc::ptr_eq(&first, &tls.current()),
        "unchanged files: same config"
    );
    // Rotate: new certificate, key and CA written over the old files.
    std::thread::sleep(Duration::from_millis(20));
    let rotated = write_pki(dir.path(), "b");
    for (from, to) in [
        (&rotated.cert, &files.cert),
        (&rotated.key, &files.key),
        (&rotated.client_ca, &files.client_ca),
    ] {
        std::fs::copy(from, to).expect("copy");
    }
    tls.reload_if_changed();
    let second = tls.current();
    assert!(!Arc::ptr_eq(&first, &second), "rotated files are loaded");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&files.key, "not a key").expect("write");
    tls.reload_if_changed();
    assert!(
        Arc::ptr_eq(&second, &tls.current()),
        "a broken key keeps the last good config"
    );
}

#[test]
fn peer_secrets_are_long_kept_as_keys_and_rotated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("peer-secret");
    std::fs::write(&path, "short\n").expect("write");
    let err = Tokens::load_peer_secret(path.clone())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with("--peer-secret-file") && err.contains("shorter than 16"),
        "{err}"
    );
    std::fs::write(&path, "0123456789abcdef-peers\n").expect("write");
    let secret = Tokens::load_peer_secret(path.clone()).expect("secret");
    assert_eq!(secret.secrets(), ["0123456789abcdef-peers"]);
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&path, "0123456789abcdef-peers\nfedcba9876543210-next\n").expect("write");
    secret.reload_if_changed();
    assert_eq!(
        secret.secrets().len(),
        2,
        "a second secret is accepted before it is first"
    );
    assert_eq!(secret.own(), "0123456789abcdef-peers");
    let generated = Tokens::generated_peer_secret().expect("generated");
    assert_eq!(generated.own().len(), 2 * GENERATED_SECRET_BYTES);
    assert_eq!(generated.secrets(), [generated.own()]);
    assert_ne!(
        generated.own(),
        Tokens::generated_peer_secret().expect("again").own()
    );
}

#[test]
fn a_changed_token_file_is_reloaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens");
    std::fs::write(&path, "old-token\n").expect("write");
    let tokens = Tokens::load(path.clone()).expect("tokens");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&path, "new-token\n").expect("write");
    tokens.reload_if_changed();
    assert!(tokens.accepts("new-token") && !tokens.accepts("old-token"));
    assert_eq!(tokens.own(), "new-token");
}

#[test]
fn unreadable_tls_files_name_the_flag() {
    let files = TlsFiles {
        cert: PathBuf::from("/nonexistent/cert.pem"),
        key: PathBuf::from("/nonexistent/key.pem"),
        client_ca: PathBuf::from("/nonexistent/ca.pem"),
    };
    let err = server_config(&files)
        .expect_err("missing files")
        .to_string();
    assert!(err.starts_with("--tls-cert /nonexistent/cert.pem"), "{err}");
}
