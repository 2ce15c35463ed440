//! Certificates re-read on SIGHUP. A [`ServerTls`] or [`ClientTls`] keeps the `tls:` section it
//! was built from and the rustls configuration built from it; [`reload_all`] rebuilds every live
//! one from its files. A rebuild that fails (a file half-written, a key that no longer matches)
//! keeps the configuration in force and says why, naming the component and the file, so a
//! botched certificate rotation never takes a listener down. Connections already open keep the
//! session they negotiated; the next handshake uses the new files.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use tokio::io::{AsyncRead, AsyncWrite};

use crate::client::TlsConnector;
use crate::config::TlsConfig;
use crate::error::TlsError;

/// What [`reload_all`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Configurations rebuilt from their files.
    pub reloaded: usize,
    /// Configurations whose files could not be used; each kept the one in force.
    pub failed: usize,
}

trait Reloadable: Send + Sync {
    fn reload(&self) -> Result<(), TlsError>;
    fn what(&self) -> &str;
}

static LIVE: Mutex<Vec<Weak<dyn Reloadable>>> = Mutex::new(Vec::new());

fn register(item: Arc<dyn Reloadable>) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(&item));
}

/// Re-reads the files of every [`ServerTls`] and [`ClientTls`] still in use (on SIGHUP). Each
/// outcome is logged: at info for a reload, at error (with the file at fault) for a failure.
pub fn reload_all() -> ReloadSummary {
    let live: Vec<Arc<dyn Reloadable>> = {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.iter().filter_map(Weak::upgrade).collect()
    };
    let mut summary = ReloadSummary::default();
    for item in live {
        match item.reload() {
            Ok(()) => {
                summary.reloaded += 1;
                tracing::info!(component = item.what(), "TLS certificates re-read");
            }
            Err(e) => {
                summary.failed += 1;
                tracing::error!(
                    component = item.what(),
                    error = %e,
                    "TLS certificates could not be re-read; the ones loaded before stay in use"
                );
            }
        }
    }
    summary
}

/// The server end of a network input: accepts TLS sessions with the certificates in force.
pub struct ServerTls {
    config: TlsConfig,
    what: String,
    acceptor: RwLock<tokio_rustls::TlsAcceptor>,
}

impl ServerTls {
    /// Builds the server configuration from `config` (reading and checking its files now) and
    /// registers it for [`reload_all`]. `what` names the component in logs, such as
    /// `pipeline main, input beats`.
    pub fn new(config: &TlsConfig, what: impl Into<String>) -> Result<Arc<ServerTls>, TlsError> {
        let acceptor = config.acceptor()?;
        let tls = Arc::new(ServerTls { config: config.clone(), what: what.into(), acceptor: RwLock::new(acceptor) });
        register(tls.clone());
        Ok(tls)
    }

    /// The TLS handshake over an accepted `stream`. Failures are `io::Error`s;
    /// [`crate::describe_handshake_error`] says why in one line.
    pub async fn accept<S>(&self, stream: S) -> io::Result<tokio_rustls::server::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = self.acceptor.read().unwrap_or_else(|e| e.into_inner()).clone();
        acceptor.accept(stream).await
    }

    /// The section this was built from.
    pub fn config(&self) -> &TlsConfig {
        &self.config
    }

    /// Rebuilds from the files now; on failure the configuration in force is kept.
    pub fn reload(&self) -> Result<(), TlsError> {
        let acceptor = self.config.acceptor()?;
        *self.acceptor.write().unwrap_or_else(|e| e.into_inner()) = acceptor;
        Ok(())
    }
}

impl Reloadable for ServerTls {
    fn reload(&self) -> Result<(), TlsError> {
        ServerTls::reload(self)
    }
    fn what(&self) -> &str {
        &self.what
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("what", &self.what).finish_non_exhaustive()
    }
}

/// The client end of a network output: opens TLS sessions with the files in force.
pub struct ClientTls {
    config: TlsConfig,
    what: String,
    connector: RwLock<TlsConnector>,
    /// Reloads so far, for a client that caches what it built over the configuration.
    generation: AtomicU64,
}

impl ClientTls {
    /// Builds the client configuration from `config` (reading and checking its files now; a
    /// warning is logged for `verify: false`) and registers it for [`reload_all`].
    pub fn new(config: &TlsConfig, what: impl Into<String>) -> Result<Arc<ClientTls>, TlsError> {
        let connector = config.connector()?;
        let tls = Arc::new(ClientTls {
            config: config.clone(),
            what: what.into(),
            connector: RwLock::new(connector),
            generation: AtomicU64::new(0),
        });
        register(tls.clone());
        Ok(tls)
    }

    /// The connector in force, for one connection.
    pub fn connector(&self) -> TlsConnector {
        self.connector.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The rustls client configuration in force (for an HTTP client built over it).
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.connector().config().clone()
    }

    /// The handshake over `stream`, dialled to `host` (see [`TlsConnector::connect`]).
    pub async fn connect<S>(&self, host: &str, stream: S) -> io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.connector().connect(host, stream).await
    }

    /// The section this was built from.
    pub fn config(&self) -> &TlsConfig {
        &self.config
    }

    /// Rebuilds from the files now; on failure the configuration in force is kept.
    pub fn reload(&self) -> Result<(), TlsError> {
        let connector = self.config.connector()?;
        *self.connector.write().unwrap_or_else(|e| e.into_inner()) = connector;
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Grows by one at each successful reload: a client that built something over
    /// [`ClientTls::client_config`] (an HTTP client) rebuilds it when this has moved.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

impl Reloadable for ClientTls {
    fn reload(&self) -> Result<(), TlsError> {
        ClientTls::reload(self)
    }
    fn what(&self) -> &str {
        &self.what
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("what", &self.what).finish_non_exhaustive()
    }
}

/// How many registered configurations named `what` are still in use (for tests).
#[cfg(test)]
pub(crate) fn live_count_for(what: &str) -> usize {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.iter().filter_map(Weak::upgrade).filter(|r| r.what() == what).count()
}
