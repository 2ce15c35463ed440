//! Bad files and bad combinations of settings: each error names the file or the key.

use std::path::{Path, PathBuf};

use sluice_config::{from_node, parse_yaml};

use crate::testing::CertSet;
use crate::{TlsConfig, TlsError};

fn server(cert: &Path, key: &Path) -> TlsConfig {
    TlsConfig { cert: Some(cert.into()), key: Some(key.into()), ..TlsConfig::default() }
}

fn yaml(text: &str) -> TlsConfig {
    from_node(&parse_yaml(text, "sluice.yml").unwrap(), "tls").unwrap()
}

fn server_err(c: &TlsConfig) -> TlsError {
    c.server_config().expect_err("the server configuration is refused")
}

fn client_err(c: &TlsConfig) -> TlsError {
    c.client_config().expect_err("the client configuration is refused")
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1"]);
    let e = server_err(&yaml("cert: ./no-such-dir/node.crt\nkey: ./no-such-dir/node.key\n"));
    assert_eq!(e.to_string(), "cannot read certificate ./no-such-dir/node.crt: No such file or directory");
    assert_eq!(e.key(), "cert");
    let missing_key = dir.path().join("node-1.key.missing");
    let e = server_err(&server(&certs.cert("node-1"), &missing_key));
    assert_eq!(e.to_string(), format!("cannot read private key {}: No such file or directory", missing_key.display()));
    assert_eq!(e.key(), "key");
    let missing_ca = dir.path().join("nope-ca.crt");
    let c = TlsConfig { ca: Some(missing_ca.clone()), ..TlsConfig::default() };
    let e = client_err(&c);
    assert_eq!(e.to_string(), format!("cannot read CA bundle {}: No such file or directory", missing_ca.display()));
    assert_eq!(e.key(), "ca");
    let c = TlsConfig { ca: Some(missing_ca.clone()), ..certs.tls("node-1") };
    assert_eq!(server_err(&c).key(), "ca");
}

#[test]
fn a_key_that_does_not_match_the_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1", "node-2"]);
    let (cert, key) = (certs.cert("node-1"), certs.key("node-2"));
    let expected = format!("certificate {} does not match key {}", cert.display(), key.display());
    let e = server_err(&server(&cert, &key));
    assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e:?}");
    assert!(e.to_string().starts_with(&expected), "{e}");
    assert_eq!(e.key(), "key");
    // The client's own certificate is checked the same way.
    let c = TlsConfig { cert: Some(cert), key: Some(key), ..certs.tls("node-1") };
    assert!(client_err(&c).to_string().starts_with(&expected));
    // The matching pair is accepted.
    certs.tls("node-1").server_config().unwrap();
    certs.tls("node-1").client_config().unwrap();
}

#[test]
fn files_without_the_pem_block_wanted_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1"]);
    let empty = write(dir.path(), "empty.crt", b"just some text\n");
    let e = server_err(&server(&empty, &certs.key("node-1")));
    assert_eq!(
        e.to_string(),
        format!("{} holds no certificate (no PEM blocks (`-----BEGIN ...-----` lines) at all)", empty.display())
    );
    assert_eq!(e.key(), "cert");
    // A key file given as the certificate, and a certificate given as the key.
    let e = server_err(&server(&certs.key("node-1"), &certs.key("node-1")));
    assert!(e.to_string().ends_with("holds no certificate (it has only PRIVATE KEY blocks)"), "{e}");
    let e = server_err(&server(&certs.cert("node-1"), &certs.cert("node-1")));
    assert_eq!(
        e.to_string(),
        format!("{} holds no private key (it has only CERTIFICATE blocks)", certs.cert("node-1").display())
    );
    assert_eq!(e.key(), "key");
    // DER instead of PEM, and an encrypted key.
    let der = write(dir.path(), "node.der", &[0x30, 0x82, 0x01, 0x0a, 0x02]);
    let e = server_err(&server(&der, &certs.key("node-1")));
    assert!(e.to_string().contains("it looks like binary DER"), "{e}");
    let enc = write(
        dir.path(),
        "enc.key",
        b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    );
    let e = server_err(&server(&certs.cert("node-1"), &enc));
    assert!(e.to_string().contains("its key is encrypted"), "{e}");
    // A CA bundle with no certificate in it.
    let c = TlsConfig { ca: Some(empty.clone()), ..TlsConfig::default() };
    let e = client_err(&c);
    assert!(e.to_string().starts_with(&format!("{} holds no CA bundle", empty.display())), "{e}");
    assert_eq!(e.key(), "ca");
}

#[test]
fn broken_pem_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1"]);
    let cut = write(dir.path(), "cut.crt", b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n");
    let e = server_err(&server(&cut, &certs.key("node-1")));
    assert!(e.to_string().starts_with(&format!("{} is not valid PEM:", cut.display())), "{e}");
    let garbage = write(dir.path(), "garbage.crt", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    let e = server_err(&server(&garbage, &certs.key("node-1")));
    assert!(e.to_string().starts_with(&format!("certificate {} cannot be used:", garbage.display())), "{e}");
    let c = TlsConfig { ca: Some(garbage.clone()), ..TlsConfig::default() };
    let e = client_err(&c);
    assert!(
        e.to_string().starts_with(&format!("CA bundle {} cannot be used: certificate 1 in it:", garbage.display())),
        "{e}"
    );
}

#[test]
fn combinations_that_cannot_work_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1"]);
    let (cert, key) = (certs.cert("node-1"), certs.key("node-1"));
    let text = format!("cert: {}\nkey: {}\nclient_auth: required\n", cert.display(), key.display());
    let e = server_err(&yaml(&text));
    assert_eq!(
        e.to_string(),
        "`client_auth: required` needs `ca`, the CA bundle client certificates are verified against"
    );
    assert_eq!(e.key(), "ca");
    let e = server_err(&yaml(&text.replace("required", "optional")));
    assert!(e.to_string().starts_with("`client_auth: optional` needs `ca`"), "{e}");
    // A server with neither `cert` nor `key`, or with only one.
    let e = server_err(&yaml("ca: ca.crt\n"));
    assert!(e.to_string().starts_with("a TLS server needs `cert`"), "{e}");
    assert_eq!(e.key(), "cert");
    let e = server_err(&yaml(&format!("cert: {}\n", cert.display())));
    assert_eq!(e.key(), "key");
    // A client with nothing to verify the server against.
    let e = client_err(&yaml("server_name: node-1\n"));
    assert!(e.to_string().starts_with("a TLS client needs `ca`"), "{e}");
    assert_eq!(e.key(), "ca");
    yaml("verify: false\n").client_config().unwrap();
    // A server name that is no name.
    let e = client_err(&TlsConfig { server_name: Some("no such name!".into()), ..certs.tls("node-1") });
    assert_eq!(e.key(), "server_name");
    assert!(e.to_string().contains("`server_name: no such name!` is neither a DNS name nor an IP address"), "{e}");
}

#[test]
fn unknown_keys_are_refused_with_their_place() {
    let root = parse_yaml("tls:\n  cert: a.crt\n  keyfile: a.key\n", "sluice.yml").unwrap();
    let tls = match &root.kind {
        sluice_config::NodeKind::Map(entries) => entries[0].1.clone(),
        _ => unreachable!(),
    };
    let e = from_node::<TlsConfig>(&tls, "pipelines.web.inputs[0].tls").unwrap_err();
    assert!(
        e.to_string().starts_with("sluice.yml:3:3: pipelines.web.inputs[0].tls.keyfile: unknown field `keyfile`"),
        "{e}"
    );
}

#[test]
fn a_disabled_section_is_not_checked() {
    let c = yaml("enabled: false\ncert: ./nowhere.crt\nclient_auth: required\n");
    assert!(!c.enabled);
    assert!(matches!(c.server_config(), Err(TlsError::Disabled)));
    assert!(matches!(c.connector(), Err(TlsError::Disabled)));
    assert_eq!(TlsError::Disabled.key(), "enabled");
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}
