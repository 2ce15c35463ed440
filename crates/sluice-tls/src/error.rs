//! Errors from building a TLS configuration. Each names the file or the `tls:` key at fault.

use std::path::PathBuf;

/// Why a server or client TLS configuration could not be built.
///
/// Every message names the file (as configured) or the key of the `tls:` section that is at
/// fault; [`TlsError::key`] gives that key, so a caller can place the error in the config file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read: `cannot read certificate ./certs/node.crt: No such file or directory`.
    #[error("cannot read {what} {}: {}", path.display(), io_message(source))]
    Read {
        key: &'static str,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file holds no PEM block of the kind wanted: `./certs/node.key holds no private key`.
    #[error("{} holds no {what} ({found})", path.display())]
    Missing { key: &'static str, what: &'static str, path: PathBuf, found: String },
    /// A file is not valid PEM (a block without its end line, bad base64).
    #[error("{} is not valid PEM: {detail}", path.display())]
    BadPem { key: &'static str, path: PathBuf, detail: String },
    /// A certificate or key was read but cannot be used.
    #[error("{what} {} cannot be used: {detail}", path.display())]
    Unusable { key: &'static str, what: &'static str, path: PathBuf, detail: String },
    /// The private key is not the one the certificate was issued for.
    #[error(
        "certificate {} does not match key {}: the key is not the one the certificate was issued for",
        cert.display(),
        key_path.display()
    )]
    KeyMismatch { cert: PathBuf, key_path: PathBuf },
    /// A combination of settings that cannot work, such as `client_auth: required` without `ca`.
    #[error("{message}")]
    Config { key: &'static str, message: String },
    /// A config with `enabled: false` was asked for a server or client configuration.
    #[error("TLS is disabled (`enabled: false`); there is no TLS configuration to build")]
    Disabled,
}

impl TlsError {
    /// The key of the `tls:` section the error is about: `cert`, `key`, `ca`, `client_auth`,
    /// `server_name`, `verify` or `enabled`.
    pub fn key(&self) -> &'static str {
        match self {
            TlsError::Read { key, .. }
            | TlsError::Missing { key, .. }
            | TlsError::BadPem { key, .. }
            | TlsError::Unusable { key, .. }
            | TlsError::Config { key, .. } => key,
            TlsError::KeyMismatch { .. } => "key",
            TlsError::Disabled => "enabled",
        }
    }

    pub(crate) fn config(key: &'static str, message: impl Into<String>) -> TlsError {
        TlsError::Config { key, message: message.into() }
    }
}

/// The OS's message without the trailing `(os error 2)`.
fn io_message(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_errors_drop_the_os_error_number() {
        let e = TlsError::Read {
            key: "cert",
            what: "certificate",
            path: "./certs/node.crt".into(),
            source: std::io::Error::from_raw_os_error(2),
        };
        assert_eq!(e.to_string(), "cannot read certificate ./certs/node.crt: No such file or directory");
        assert_eq!(e.key(), "cert");
    }
}
