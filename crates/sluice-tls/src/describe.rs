//! One-line causes of failed handshakes and the peer's name, for log lines on both ends.

use std::io;

use rustls::{AlertDescription, CertificateError, CommonState, PeerIncompatible};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Why a TLS handshake (or the first read or write after it) failed, in one line an operator
/// can act on: `the peer's certificate is not signed by the configured CA (UnknownIssuer)`,
/// `the peer sent no client certificate but one is required`, `certificate name mismatch:
/// expected node-1, the certificate is for node-2, localhost, 127.0.0.1`, `the peer does not
/// speak TLS`. Works on the errors of either end.
pub fn describe_handshake_error(error: &io::Error) -> String {
    if let Some(tls) = error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        return describe_rustls(tls);
    }
    match error.kind() {
        io::ErrorKind::UnexpectedEof => "the peer closed the connection during the handshake (it may have refused our \
                                         certificate or TLS version, or not speak TLS)"
            .to_string(),
        io::ErrorKind::ConnectionReset => "the peer reset the connection during the handshake".to_string(),
        io::ErrorKind::TimedOut => "the handshake timed out".to_string(),
        _ => error.to_string(),
    }
}

fn describe_rustls(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(cert) => describe_certificate(cert),
        rustls::Error::NoCertificatesPresented => "the peer sent no client certificate but one is required".to_string(),
        rustls::Error::AlertReceived(alert) => describe_alert(*alert),
        rustls::Error::PeerIncompatible(why) => describe_incompatible(why),
        rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => {
            "the peer does not speak TLS (what it sent is not a TLS record)".to_string()
        }
        rustls::Error::InvalidMessage(why) => {
            format!("the peer does not speak TLS, or sent a corrupt message ({why:?})")
        }
        rustls::Error::InappropriateMessage { .. } | rustls::Error::InappropriateHandshakeMessage { .. } => {
            format!("the peer broke the TLS protocol ({e})")
        }
        other => format!("TLS error: {other}"),
    }
}

fn describe_certificate(e: &CertificateError) -> String {
    match e {
        CertificateError::UnknownIssuer => {
            "the peer's certificate is not signed by the configured CA (UnknownIssuer)".to_string()
        }
        CertificateError::NotValidForName => "certificate name mismatch (NotValidForName)".to_string(),
        CertificateError::NotValidForNameContext { expected, presented } => format!(
            "certificate name mismatch: expected {}, the certificate is for {}",
            expected.to_str(),
            if presented.is_empty() {
                "no name at all".to_string()
            } else {
                presented.iter().map(|p| bare_name(p)).collect::<Vec<_>>().join(", ")
            }
        ),
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the peer's certificate has expired (Expired)".to_string()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the peer's certificate is not valid yet; check both clocks (NotValidYet)".to_string()
        }
        CertificateError::BadSignature => "the peer's certificate has a bad signature (BadSignature)".to_string(),
        CertificateError::BadEncoding => "the peer's certificate is malformed (BadEncoding)".to_string(),
        CertificateError::Revoked => "the peer's certificate is revoked (Revoked)".to_string(),
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "the peer's certificate is not meant for this use: its extended key usage lacks server or client \
             authentication (InvalidPurpose)"
                .to_string()
        }
        other => format!("the peer's certificate was refused ({other:?})"),
    }
}

/// `node-1` for rustls's `DnsName("node-1")`, `127.0.0.1` for `IpAddress(127.0.0.1)`.
fn bare_name(presented: &str) -> &str {
    for prefix in ["DnsName(\"", "IpAddress("] {
        if let Some(rest) = presented.strip_prefix(prefix) {
            return rest.trim_end_matches(')').trim_end_matches('"');
        }
    }
    presented
}

fn describe_alert(alert: AlertDescription) -> String {
    match alert {
        AlertDescription::CertificateRequired => {
            "the peer requires a client certificate and none was sent (set `cert` and `key`)".to_string()
        }
        AlertDescription::UnknownCA => {
            "the peer refused our certificate: it is not signed by a CA the peer trusts (alert UnknownCA)".to_string()
        }
        AlertDescription::BadCertificate
        | AlertDescription::CertificateUnknown
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::CertificateExpired
        | AlertDescription::CertificateRevoked
        | AlertDescription::AccessDenied => format!("the peer refused our certificate (alert {alert:?})"),
        AlertDescription::ProtocolVersion => {
            "the peer accepts none of the TLS versions we offer; compare `min_version` on both sides (alert \
             ProtocolVersion)"
                .to_string()
        }
        AlertDescription::HandshakeFailure => {
            "the peer found nothing in common with our offer: TLS versions, cipher suites or key types (alert \
             HandshakeFailure)"
                .to_string()
        }
        other => format!("the peer aborted the handshake (alert {other:?})"),
    }
}

fn describe_incompatible(why: &PeerIncompatible) -> String {
    match why {
        PeerIncompatible::SupportedVersionsExtensionRequired
        | PeerIncompatible::ServerDoesNotSupportTls12Or13
        | PeerIncompatible::ServerTlsVersionIsDisabledByOurConfig
        | PeerIncompatible::Tls12NotOffered
        | PeerIncompatible::Tls12NotOfferedOrEnabled => {
            format!("no TLS version in common with the peer; compare `min_version` on both sides ({why:?})")
        }
        PeerIncompatible::NoCipherSuitesInCommon
        | PeerIncompatible::NoKxGroupsInCommon
        | PeerIncompatible::NoSignatureSchemesInCommon => {
            format!("no cipher suite, key exchange or signature scheme in common with the peer ({why:?})")
        }
        other => format!("the peer's TLS is incompatible with ours ({other:?})"),
    }
}

/// The name in the peer's leaf certificate, for logs: its subject's common name, or else its
/// first subject alternative name (a DNS name or an IP address). `None` before the handshake,
/// when the peer sent no certificate, or when the certificate names nothing.
pub fn peer_certificate_subject(state: &CommonState) -> Option<String> {
    let leaf = state.peer_certificates()?.first()?;
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    if let Some(cn) = cert.subject().iter_common_name().find_map(|cn| cn.as_str().ok()) {
        return Some(cn.to_string());
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        GeneralName::DNSName(dns) => Some(dns.to_string()),
        GeneralName::IPAddress(ip) => match ip.len() {
            4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).ok()?).to_string()),
            16 => Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).ok()?).to_string()),
            _ => None,
        },
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(e: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn names_the_common_causes() {
        let unknown = wrap(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer));
        assert_eq!(
            describe_handshake_error(&unknown),
            "the peer's certificate is not signed by the configured CA (UnknownIssuer)"
        );
        assert_eq!(
            describe_handshake_error(&wrap(rustls::Error::NoCertificatesPresented)),
            "the peer sent no client certificate but one is required"
        );
        let plain = wrap(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType));
        assert!(describe_handshake_error(&plain).starts_with("the peer does not speak TLS"));
        let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof");
        assert!(describe_handshake_error(&eof).starts_with("the peer closed the connection during the handshake"));
        let other = io::Error::other("something else");
        assert_eq!(describe_handshake_error(&other), "something else");
    }
}
