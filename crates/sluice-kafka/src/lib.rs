//! What the `kafka` input and output share: how to reach the brokers.
//!
//! [`Connection`] is the part of their config sections that says where the brokers are and
//! how to talk to them — `bootstrap_servers`, `tls:` (the same section as every network
//! component, mapped onto librdkafka's OpenSSL settings), `sasl:` (PLAIN, SCRAM-SHA-256,
//! SCRAM-SHA-512) and `librdkafka_options` for anything else — and [`Connection::client_config`]
//! turns it into a librdkafka configuration. Everything is checked when the component is
//! built: the TLS files are read and the key matched to its certificate (so `sluice validate`
//! catches them), and a librdkafka option that the component itself sets is refused, naming it.
//!
//! [`refusal`] and [`describe`] are for the components' logs: librdkafka retries a broker that
//! refuses the credentials or fails the TLS handshake as it retries one that is down, so
//! without a line of their own such failures look like an outage.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_tls::{TlsConfig, TlsVersion};

/// The connection keys of a `kafka` input or output, declared once here and written flat among
/// the component's own keys: `bootstrap_servers`, `tls`, `sasl`, `librdkafka_options`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Connection {
    /// `host:port[,host:port...]` of brokers to learn the cluster from.
    pub bootstrap_servers: String,
    pub tls: Option<TlsConfig>,
    pub sasl: Option<Sasl>,
    /// librdkafka settings by their own names, for what the component has no key for.
    #[serde(default)]
    pub librdkafka_options: BTreeMap<String, String>,
}

impl Connection {
    /// Reads a component's connection keys and its own keys `T` (which must not declare the
    /// connection's); an unknown key is an error listing both.
    pub fn read<T: serde::de::DeserializeOwned>(spec: &ComponentSpec) -> Result<(Connection, T), ConfigError> {
        spec.settings_with()
    }
}

/// `sasl:`: the mechanism and the credentials (give them through `${VAR}`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sasl {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN", alias = "plain")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256", alias = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512", alias = "scram-sha-512")]
    ScramSha512,
}

impl SaslMechanism {
    fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// How loud a line librdkafka logs is in sluice's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogAs {
    /// Its warnings and errors: a warning, which the component rate-limits (they repeat at
    /// every reconnection).
    Warning,
    /// Its notices.
    Info,
    /// Its informational and debug lines.
    Debug,
}

impl LogAs {
    pub fn of(level: RDKafkaLogLevel) -> LogAs {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => LogAs::Warning,
            RDKafkaLogLevel::Notice => LogAs::Info,
            RDKafkaLogLevel::Info | RDKafkaLogLevel::Debug => LogAs::Debug,
        }
    }
}

/// What is wrong when `error` and `reason` (from librdkafka's error callback) mean that the
/// brokers will not take this client as configured: `"authentication failed"` (SASL
/// credentials or mechanism refused) or `"the TLS handshake failed"` (the broker's certificate
/// not verified, or the broker's TLS alert, such as for a missing client certificate). `None`
/// for other errors.
pub fn refusal(error: &KafkaError, reason: &str) -> Option<&'static str> {
    match error.rdkafka_error_code()? {
        RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => Some("authentication failed"),
        RDKafkaErrorCode::SSL => Some("the TLS handshake failed"),
        // With TLS 1.3 the broker checks the client's certificate after the client considers
        // the handshake done: its alert arrives as a failed receive.
        RDKafkaErrorCode::BrokerTransportFailure if reason.contains("SSL routines") && reason.contains(" alert ") => {
            Some("the TLS handshake failed")
        }
        _ => None,
    }
}

/// How a client made by [`Connection::client_config`] reaches the brokers, for log lines:
/// `a:9093 over SASL_SSL, SASL mechanism SCRAM-SHA-512 as user sluice` (never the password).
pub fn describe(config: &ClientConfig) -> String {
    let servers = config.get("bootstrap.servers").unwrap_or_default();
    let protocol = config.get("security.protocol").unwrap_or("plaintext").to_uppercase();
    match (config.get("sasl.mechanism"), config.get("sasl.username")) {
        (Some(mechanism), Some(user)) => {
            format!("{servers} over {protocol}, SASL mechanism {mechanism} as user {user}")
        }
        _ => format!("{servers} over {protocol}"),
    }
}

impl Connection {
    /// The librdkafka configuration for these settings; `owned` are the librdkafka keys the
    /// component sets itself, which `librdkafka_options` may not override.
    pub fn client_config(&self, spec: &ComponentSpec, owned: &[&str]) -> Result<ClientConfig, ConfigError> {
        let servers = self.bootstrap_servers.trim();
        if servers.is_empty()
            || servers.split(',').any(|s| {
                let s = s.trim();
                !matches!(s.rsplit_once(':'), Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok())
            })
        {
            return Err(spec.key_error(
                "bootstrap_servers",
                format!("`{servers}` is not a list of `host:port` addresses (like 127.0.0.1:9092,broker-2:9092)"),
            ));
        }
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", servers);
        config.set("client.id", format!("sluice-{}", spec.id));
        let tls = self.tls.as_ref().filter(|t| t.enabled);
        if let Some(tls) = tls {
            self.apply_tls(spec, tls, &mut config)?;
        }
        match (&self.sasl, tls.is_some()) {
            (None, true) => {
                config.set("security.protocol", "ssl");
            }
            (None, false) => {}
            (Some(sasl), with_tls) => {
                if sasl.username.is_empty() {
                    return Err(spec.nested_key_error(&["sasl", "username"], "must not be empty"));
                }
                config.set("security.protocol", if with_tls { "sasl_ssl" } else { "sasl_plaintext" });
                config.set("sasl.mechanism", sasl.mechanism.name());
                config.set("sasl.username", &sasl.username);
                config.set("sasl.password", &sasl.password);
                if !with_tls {
                    tracing::warn!(component = %spec.path,
                        "kafka: SASL without tls: the password crosses the network readable by anyone on the path \
                         (PLAIN sends it as is)");
                }
            }
        }
        for (key, value) in &self.librdkafka_options {
            let managed = owned.contains(&key.as_str())
                || ["bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username", "sasl.password"]
                    .contains(&key.as_str())
                || key.starts_with("ssl.");
            if managed {
                return Err(spec.nested_key_error(
                    &["librdkafka_options", key],
                    format!("`{key}` is set by the component's own keys; set those instead"),
                ));
            }
            config.set(key, value);
        }
        Ok(config)
    }

    /// Puts `config` through librdkafka once, after the component has set its own keys, so that
    /// a misspelt name or a bad value in `librdkafka_options` is a config error naming that key
    /// (and `sluice validate` reports it), not a failure at start.
    pub fn check(&self, spec: &ComponentSpec, config: &ClientConfig) -> Result<(), ConfigError> {
        let Err(e) = config.create_native_config() else { return Ok(()) };
        let message = e.to_string();
        let key = self.librdkafka_options.keys().find(|k| message.contains(k.as_str()));
        Err(match key {
            Some(k) => spec.nested_key_error(&["librdkafka_options", k], message),
            None => spec.error(format!("librdkafka refuses the configuration: {message}")),
        })
    }

    fn apply_tls(&self, spec: &ComponentSpec, tls: &TlsConfig, config: &mut ClientConfig) -> Result<(), ConfigError> {
        let at = |key: &str, message: String| spec.nested_key_error(&["tls", key], message);
        // The files are read and checked here as for every TLS client, so that errors name
        // them the same way; librdkafka then reads them with OpenSSL.
        tls.client_config().map_err(|e| at(e.key(), e.to_string()))?;
        if tls.server_name.is_some() {
            return Err(at(
                "server_name",
                "is not taken by the kafka components: librdkafka verifies each broker against the name it \
                 advertises"
                    .into(),
            ));
        }
        if tls.min_version == TlsVersion::V1_3 {
            return Err(at(
                "min_version",
                "\"1.3\" is not taken by the kafka components (librdkafka speaks 1.2 and 1.3)".into(),
            ));
        }
        if let Some(ca) = &tls.ca {
            config.set("ssl.ca.location", ca.display().to_string());
        }
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            config.set("ssl.certificate.location", cert.display().to_string());
            config.set("ssl.key.location", key.display().to_string());
        }
        if !tls.verify {
            config.set("enable.ssl.certificate.verification", "false");
            config.set("ssl.endpoint.identification.algorithm", "none");
        } else {
            config.set("ssl.endpoint.identification.algorithm", "https");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafka_errors_are_warnings_and_its_chatter_is_debug() {
        assert_eq!(LogAs::of(RDKafkaLogLevel::Error), LogAs::Warning);
        assert_eq!(LogAs::of(RDKafkaLogLevel::Critical), LogAs::Warning);
        assert_eq!(LogAs::of(RDKafkaLogLevel::Notice), LogAs::Info);
        assert_eq!(LogAs::of(RDKafkaLogLevel::Debug), LogAs::Debug);
    }

    fn spec(yaml: &str) -> ComponentSpec {
        let text = format!("pipelines:\n  p:\n    inputs: [{{type: stdin}}]\n    outputs:\n      - {yaml}\n");
        let root = sluice_config::model::load_str(&text, "test.yml").unwrap_or_else(|e| panic!("{e}"));
        root.pipelines.into_iter().next().unwrap().outputs.remove(0)
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Only {
        bootstrap_servers: String,
        tls: Option<TlsConfig>,
        sasl: Option<Sasl>,
        #[serde(default)]
        librdkafka_options: BTreeMap<String, String>,
        #[allow(dead_code)]
        topic: Option<String>,
    }

    fn config(yaml: &str) -> Result<ClientConfig, ConfigError> {
        let spec = spec(yaml);
        let o: Only = spec.settings()?;
        let connection = Connection {
            bootstrap_servers: o.bootstrap_servers,
            tls: o.tls,
            sasl: o.sasl,
            librdkafka_options: o.librdkafka_options,
        };
        connection.client_config(&spec, &["acks"])
    }

    #[test]
    fn plain_sasl_tls_and_options() {
        let c = config("{type: kafka, id: out, bootstrap_servers: 'a:9092,b:9093', topic: t}").unwrap();
        assert_eq!(c.get("bootstrap.servers"), Some("a:9092,b:9093"));
        assert_eq!(c.get("client.id"), Some("sluice-out"));
        assert_eq!(c.get("security.protocol"), None);

        let c = config(
            "{type: kafka, bootstrap_servers: 'a:9092', sasl: {mechanism: SCRAM-SHA-512, username: u, password: p}, \
             librdkafka_options: {socket.keepalive.enable: 'true'}}",
        )
        .unwrap();
        assert_eq!(c.get("security.protocol"), Some("sasl_plaintext"));
        assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(c.get("socket.keepalive.enable"), Some("true"));

        let dir = tempfile::tempdir().unwrap();
        let certs = sluice_tls::testing::CertSet::generate(dir.path(), &["client"]);
        let c = config(&format!(
            "{{type: kafka, bootstrap_servers: 'a:9093', tls: {{ca: '{}', cert: '{}', key: '{}'}}, sasl: {{mechanism: plain, username: u, password: p}}}}",
            certs.ca_cert.display(),
            certs.cert("client").display(),
            certs.key("client").display()
        ))
        .unwrap();
        assert_eq!(c.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(c.get("ssl.ca.location"), Some(certs.ca_cert.to_str().unwrap()));
        assert_eq!(c.get("ssl.key.location"), Some(certs.key("client").to_str().unwrap()));
        assert_eq!(c.get("ssl.endpoint.identification.algorithm"), Some("https"));
        assert_eq!(describe(&c), "a:9093 over SASL_SSL, SASL mechanism PLAIN as user u");
    }

    #[test]
    fn refusals_are_told_from_outages() {
        let global = KafkaError::Global;
        assert_eq!(refusal(&global(RDKafkaErrorCode::Authentication), ""), Some("authentication failed"));
        assert_eq!(refusal(&global(RDKafkaErrorCode::SSL), ""), Some("the TLS handshake failed"));
        let alert = "ssl://b:9093/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate";
        assert_eq!(refusal(&global(RDKafkaErrorCode::BrokerTransportFailure), alert), Some("the TLS handshake failed"));
        let reset = "b:9092/bootstrap: Connection refused";
        assert_eq!(refusal(&global(RDKafkaErrorCode::BrokerTransportFailure), reset), None);
        assert_eq!(refusal(&global(RDKafkaErrorCode::AllBrokersDown), "1/1 brokers are down"), None);
        let c = config("{type: kafka, bootstrap_servers: 'a:9092'}").unwrap();
        assert_eq!(describe(&c), "a:9092 over PLAINTEXT");
    }

    #[test]
    fn errors_name_the_key() {
        let e = |yaml: &str| config(yaml).unwrap_err().to_string();
        assert!(e("{type: kafka, bootstrap_servers: 'nope'}").contains("bootstrap_servers"));
        assert!(e("{type: kafka, bootstrap_servers: 'a:1', tls: {ca: missing.crt}}").contains("tls.ca"));
        assert!(
            e("{type: kafka, bootstrap_servers: 'a:1', tls: {verify: false, server_name: x}}")
                .contains("tls.server_name")
        );
        let m = e("{type: kafka, bootstrap_servers: 'a:1', librdkafka_options: {acks: '0'}}");
        assert!(m.contains("librdkafka_options.acks"), "{m}");
        let m = e("{type: kafka, bootstrap_servers: 'a:1', librdkafka_options: {ssl.ca.location: x}}");
        assert!(m.contains("set by the component's own keys"), "{m}");
        let m = e("{type: kafka, bootstrap_servers: 'a:1', sasl: {mechanism: GSSAPI, username: u, password: p}}");
        assert!(m.contains("sasl.mechanism"), "{m}");
    }
}
