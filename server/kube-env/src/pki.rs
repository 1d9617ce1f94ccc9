//! The control plane's certificates and keys, made afresh for every start: one CA,
//! the API server's serving certificate (127.0.0.1 and `localhost`), the front-proxy
//! client certificate the aggregator presents, and the service-account signing key.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

use crate::EnvError;

/// The CN the front-proxy client certificate carries (and the API server allows).
pub const FRONT_PROXY_CN: &str = "front-proxy-client";

/// Paths of the files written by [`write`].
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate (PEM); clients trust it.
    pub ca_cert: PathBuf,
    /// The CA certificate's PEM text.
    pub ca_pem: String,
    /// Serving certificate and key.
    pub serving_cert: PathBuf,
    /// Serving key.
    pub serving_key: PathBuf,
    /// Front-proxy client certificate.
    pub proxy_cert: PathBuf,
    /// Front-proxy client key.
    pub proxy_key: PathBuf,
    /// Service-account signing key.
    pub service_account_key: PathBuf,
    /// Its public half (verifies tokens).
    pub service_account_public: PathBuf,
}

/// Makes the certificates and writes them under `dir`.
pub fn write(dir: &Path) -> Result<Pki, EnvError> {
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(pki)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "gangway test control plane CA");
    let issuer =
        CertifiedIssuer::self_signed(ca, KeyPair::generate().map_err(pki)?).map_err(pki)?;

    let serving_key = KeyPair::generate().map_err(pki)?;
    let mut serving = CertificateParams::new(vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default.svc".to_string(),
    ])
    .map_err(pki)?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving = serving.signed_by(&serving_key, &issuer).map_err(pki)?;

    let proxy_key = KeyPair::generate().map_err(pki)?;
    let mut proxy = CertificateParams::new(Vec::<String>::new()).map_err(pki)?;
    proxy
        .distinguished_name
        .push(DnType::CommonName, FRONT_PROXY_CN);
    let proxy = proxy.signed_by(&proxy_key, &issuer).map_err(pki)?;

    let sa_key = KeyPair::generate().map_err(pki)?;
    let ca_pem = issuer.as_ref().pem();
    let files = Pki {
        ca_cert: dir.join("ca.pem"),
        ca_pem: ca_pem.clone(),
        serving_cert: dir.join("apiserver.pem"),
        serving_key: dir.join("apiserver-key.pem"),
        proxy_cert: dir.join("front-proxy.pem"),
        proxy_key: dir.join("front-proxy-key.pem"),
        service_account_key: dir.join("service-account-key.pem"),
        service_account_public: dir.join("service-account.pub"),
    };
    write_file(&files.ca_cert, &ca_pem)?;
    write_file(&files.serving_cert, &serving.pem())?;
    write_file(&files.serving_key, &serving_key.serialize_pem())?;
    write_file(&files.proxy_cert, &proxy.pem())?;
    write_file(&files.proxy_key, &proxy_key.serialize_pem())?;
    write_file(&files.service_account_key, &sa_key.serialize_pem())?;
    write_file(&files.service_account_public, &sa_key.public_key_pem())?;
    Ok(files)
}

fn write_file(path: &Path, text: &str) -> Result<(), EnvError> {
    std::fs::write(path, text).map_err(|e| EnvError::Io(format!("{}: {e}", path.display())))
}

fn pki(e: rcgen::Error) -> EnvError {
    EnvError::Pki(e.to_string())
}
