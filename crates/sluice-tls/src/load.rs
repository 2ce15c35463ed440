//! Reading PEM files: certificate chains, private keys and CA bundles, with errors that name
//! the file and say what is wrong with it.

use std::path::Path;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{PemObject, SectionKind};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::TlsError;

/// A certificate chain and the private key that goes with its leaf, checked to match.
pub(crate) struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

/// The PEM blocks of a file, in order.
fn sections(key: &'static str, what: &'static str, path: &Path) -> Result<Vec<(SectionKind, Vec<u8>)>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read { key, what, path: path.to_path_buf(), source })?;
    let mut out = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(&bytes) {
        match section {
            Ok(s) => out.push(s),
            Err(e) => return Err(TlsError::BadPem { key, path: path.to_path_buf(), detail: e.to_string() }),
        }
    }
    if out.is_empty() {
        let found = if bytes.windows(21).any(|w| w == b"ENCRYPTED PRIVATE KEY") {
            "its key is encrypted; decrypt it with `openssl pkey -in KEY -out KEY.plain`".to_string()
        } else if bytes.first() == Some(&0x30) {
            "no PEM blocks; it looks like binary DER, convert it with `openssl x509 -inform der` or \
             `openssl pkey -inform der`"
                .to_string()
        } else {
            "no PEM blocks (`-----BEGIN ...-----` lines) at all".to_string()
        };
        return Err(TlsError::Missing { key, what, path: path.to_path_buf(), found });
    }
    Ok(out)
}

fn label(kind: SectionKind) -> &'static str {
    match kind {
        SectionKind::Certificate => "CERTIFICATE",
        SectionKind::PublicKey => "PUBLIC KEY",
        SectionKind::RsaPrivateKey => "RSA PRIVATE KEY",
        SectionKind::PrivateKey => "PRIVATE KEY",
        SectionKind::EcPrivateKey => "EC PRIVATE KEY",
        SectionKind::Crl => "X509 CRL",
        SectionKind::Csr => "CERTIFICATE REQUEST",
        _ => "other",
    }
}

fn only_found(sections: &[(SectionKind, Vec<u8>)]) -> String {
    let mut labels: Vec<&str> = sections.iter().map(|(k, _)| label(*k)).collect();
    labels.dedup();
    format!("it has only {} blocks", labels.join(", "))
}

/// The certificates of a PEM file, in order (a chain, leaf first, or a CA bundle).
pub(crate) fn certificates(
    key: &'static str,
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let all = sections(key, what, path)?;
    let certs: Vec<CertificateDer<'static>> = all
        .iter()
        .filter(|(kind, _)| *kind == SectionKind::Certificate)
        .map(|(_, der)| CertificateDer::from(der.clone()))
        .collect();
    if certs.is_empty() {
        return Err(TlsError::Missing { key, what, path: path.to_path_buf(), found: only_found(&all) });
    }
    Ok(certs)
}

/// The first private key of a PEM file: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
pub(crate) fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let all = sections("key", "private key", path)?;
    all.iter().find_map(|(kind, der)| PrivateKeyDer::from_pem(*kind, der.clone())).ok_or_else(|| TlsError::Missing {
        key: "key",
        what: "private key",
        path: path.to_path_buf(),
        found: only_found(&all),
    })
}

/// Reads `cert` and `key` and checks the key is the one the leaf certificate was issued for.
pub(crate) fn identity(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<Identity, TlsError> {
    let chain = certificates("cert", "certificate", cert)?;
    let key_der = private_key(key)?;
    let signing_key = provider.key_provider.load_private_key(key_der.clone_key()).map_err(|e| TlsError::Unusable {
        key: "key",
        what: "private key",
        path: key.to_path_buf(),
        detail: e.to_string(),
    })?;
    match CertifiedKey::new(chain.clone(), signing_key).keys_match() {
        // `Unknown`: the key cannot tell its public half; the handshake will tell instead.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(TlsError::KeyMismatch { cert: cert.to_path_buf(), key_path: key.to_path_buf() });
        }
        Err(e) => return Err(unusable_cert(cert, e)),
    }
    Ok(Identity { chain, key: key_der })
}

pub(crate) fn unusable_cert(cert: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Unusable { key: "cert", what: "certificate", path: cert.to_path_buf(), detail: e.to_string() }
}

/// A CA bundle as trust anchors. Every certificate in it must parse.
pub(crate) fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for (i, cert) in certificates("ca", "CA bundle", path)?.into_iter().enumerate() {
        store.add(cert).map_err(|e| TlsError::Unusable {
            key: "ca",
            what: "CA bundle",
            path: path.to_path_buf(),
            detail: format!("certificate {} in it: {e}", i + 1),
        })?;
    }
    Ok(store)
}
