//! A certificate authority for mutual-TLS tests, made at start with rcgen: its PEM file,
//! and certificates for 127.0.0.1 it signs, usable as server and client identities, for
//! replicas (a peer certificate: subject organization `gangway:peers`) and for clients.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A CA and the certificates it signed, as PEM files in a directory.
pub struct Pki {
    /// The CA's certificate.
    pub ca: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA named `name`, written to `dir/name.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
        let ca = dir.join(format!("{name}.pem"));
        std::fs::write(&ca, issuer.as_ref().pem()).expect("write CA");
        Self { ca, issuer }
    }

    /// A client certificate with subject CN `name`: (cert, key) files.
    pub fn issue(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        self.issue_as(dir, name, None)
    }

    /// A replica's certificate: subject organization `gangway:peers`.
    pub fn issue_peer(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        self.issue_as(dir, name, Some(gangway_server::auth::PEER_ORGANIZATION))
    }

    fn issue_as(&self, dir: &Path, name: &str, organization: Option<&str>) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        if let Some(o) = organization {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let paths = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        std::fs::write(&paths.0, cert.pem()).expect("write cert");
        std::fs::write(&paths.1, key.serialize_pem()).expect("write key");
        paths
    }
}
