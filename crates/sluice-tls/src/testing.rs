//! Test certificates: a CA and leaf certificates signed by it, written as PEM files into a
//! directory. Behind the `testing` feature, for the tests of the crates that use TLS.
//!
//! ```ignore
//! let dir = tempfile::tempdir().unwrap();
//! let certs = CertSet::generate(dir.path(), &["node-1", "node-2"]);
//! let rogue = CertSet::generate_other_ca(dir.path(), &["node-1"]); // an unrelated CA
//! let server = certs.tls("node-1"); // cert, key and ca set: mutual TLS
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::config::TlsConfig;

/// A CA and the leaf certificates it signed, as files: `<prefix>ca.crt`, `<prefix>ca.key`,
/// and per name `<prefix><name>.crt` and `<prefix><name>.key`.
pub struct CertSet {
    /// The directory the files are in.
    pub dir: PathBuf,
    /// The CA certificate (PEM), for `ca:`.
    pub ca_cert: PathBuf,
    /// The CA's private key (PEM).
    pub ca_key: PathBuf,
    prefix: String,
    issuer: Issuer<'static, KeyPair>,
}

impl CertSet {
    /// A new CA and one leaf certificate per name, written into `dir` as `ca.crt`, `ca.key`,
    /// `<name>.crt` and `<name>.key`. Each leaf carries the subject alternative names `name`,
    /// `localhost` and `127.0.0.1`, and is good for both server and client authentication.
    /// Panics on failure (it is for tests).
    pub fn generate(dir: &Path, names: &[&str]) -> CertSet {
        CertSet::generate_with_prefix(dir, "", "Sluice test CA", names)
    }

    /// Like [`CertSet::generate`], but a second CA unrelated to the first, with files prefixed
    /// `other-` (`other-ca.crt`, `other-<name>.crt`, ...) so both can share one directory.
    /// Its certificates are what "a certificate from another CA is refused" tests present.
    pub fn generate_other_ca(dir: &Path, names: &[&str]) -> CertSet {
        CertSet::generate_with_prefix(dir, "other-", "Unrelated test CA", names)
    }

    /// A CA named `ca_name` with files prefixed `prefix`, and leaves for `names`.
    pub fn generate_with_prefix(dir: &Path, prefix: &str, ca_name: &str, names: &[&str]) -> CertSet {
        std::fs::create_dir_all(dir).expect("create the certificate directory");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, ca_name);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-signed CA certificate");
        let ca_cert = dir.join(format!("{prefix}ca.crt"));
        let ca_key = dir.join(format!("{prefix}ca.key"));
        write(&ca_cert, &cert.pem());
        write(&ca_key, &key.serialize_pem());
        let set = CertSet {
            dir: dir.to_path_buf(),
            ca_cert,
            ca_key,
            prefix: prefix.to_string(),
            issuer: Issuer::new(params, key),
        };
        for name in names {
            set.add(name);
        }
        set
    }

    /// Signs one more leaf certificate for `name` (SANs `name`, `localhost`, `127.0.0.1`) and
    /// writes its files; returns the certificate and key paths.
    pub fn add(&self, name: &str) -> (PathBuf, PathBuf) {
        let mut sans = vec![
            SanType::DnsName("localhost".try_into().expect("a DNS name")),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ];
        let own = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.try_into().unwrap_or_else(|e| panic!("`{name}` is not a DNS name: {e}"))),
        };
        if !sans.contains(&own) {
            sans.insert(0, own);
        }
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed leaf certificate");
        let (cert_path, key_path) = (self.path(name, "crt"), self.path(name, "key"));
        write(&cert_path, &cert.pem());
        write(&key_path, &key.serialize_pem());
        (cert_path, key_path)
    }

    /// The certificate file of `name`. Panics if it was not generated.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.existing(name, "crt")
    }

    /// The private key file of `name`. Panics if it was not generated.
    pub fn key(&self, name: &str) -> PathBuf {
        self.existing(name, "key")
    }

    /// A `tls:` section for `name`: `cert`, `key` and `ca` set, the rest default. On a server
    /// that is mutual TLS (`client_auth` defaults to `required` when `ca` is set); on a client
    /// it verifies the server and presents `name`'s certificate.
    pub fn tls(&self, name: &str) -> TlsConfig {
        TlsConfig {
            cert: Some(self.cert(name)),
            key: Some(self.key(name)),
            ca: Some(self.ca_cert.clone()),
            ..TlsConfig::default()
        }
    }

    fn path(&self, name: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{}{name}.{ext}", self.prefix))
    }

    fn existing(&self, name: &str, ext: &str) -> PathBuf {
        let path = self.path(name, ext);
        assert!(path.exists(), "no test certificate for `{name}` in {}: generate or add it first", self.dir.display());
        path
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
