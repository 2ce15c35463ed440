//! The HTTP client of the outputs that speak HTTP (`http`, `elasticsearch`): reqwest with the
//! output's timeout, default headers and `tls:` section, rebuilt when the certificates are
//! re-read (SIGHUP) so that new connections use them. Connections are kept alive and reused.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use sluice_tls::ClientTls;

use crate::OutputContext;

/// The client in use, and what it is built from.
pub(crate) struct HttpClient {
    timeout: Duration,
    headers: HeaderMap,
    tls: Option<Arc<ClientTls>>,
    /// The client, and the TLS generation it was built with.
    current: parking_lot::Mutex<(u64, reqwest::Client)>,
}

impl HttpClient {
    pub(crate) fn new(
        timeout: Duration,
        headers: HeaderMap,
        tls: Option<Arc<ClientTls>>,
    ) -> reqwest::Result<HttpClient> {
        let client = build(timeout, &headers, tls.as_deref())?;
        let generation = generation(tls.as_deref());
        Ok(HttpClient { timeout, headers, tls, current: parking_lot::Mutex::new((generation, client)) })
    }

    /// The client for one request: rebuilt first if the certificates were re-read since.
    pub(crate) fn get(&self, ctx: &OutputContext) -> reqwest::Client {
        let mut current = self.current.lock();
        let now = generation(self.tls.as_deref());
        if current.0 != now {
            match build(self.timeout, &self.headers, self.tls.as_deref()) {
                Ok(rebuilt) => current.1 = rebuilt,
                Err(e) => tracing::error!(pipeline = %ctx.pipeline, output = %ctx.id, error = %e,
                    "cannot rebuild the HTTP client with the re-read certificates; keeping the one in use"),
            }
            current.0 = now;
        }
        current.1.clone()
    }
}

/// The `headers:` of an output section as request headers; a bad name or value is an error at
/// `headers`.
pub(crate) fn configured_headers(
    spec: &sluice_config::model::ComponentSpec,
    configured: &std::collections::BTreeMap<String, String>,
) -> Result<HeaderMap, sluice_config::ConfigError> {
    let mut headers = HeaderMap::new();
    for (name, value) in configured {
        let n = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| spec.key_error("headers", format!("`{name}` is not a valid header name")))?;
        let v = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| spec.key_error("headers", format!("the value of `{name}` is not a valid header value")))?;
        headers.insert(n, v);
    }
    Ok(headers)
}

fn build(timeout: Duration, headers: &HeaderMap, tls: Option<&ClientTls>) -> reqwest::Result<reqwest::Client> {
    // reqwest is built without a default crypto provider; install ring once for https.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .default_headers(headers.clone())
        .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")));
    if let Some(tls) = tls {
        builder = builder.tls_backend_preconfigured((*tls.client_config()).clone());
    }
    builder.build()
}

fn generation(tls: Option<&ClientTls>) -> u64 {
    tls.map_or(0, ClientTls::generation)
}
