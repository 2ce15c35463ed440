//! The `tcp` input's settings: the shared listener keys ([`Listener`]) and its own, with their
//! defaults and checks. The `tls:` files are read by the caller.

use std::time::Duration;

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError};
use sluice_core::FieldPath;

use crate::codec::Codec;
use crate::listener::Listener;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TcpConfig {
    #[serde(default)]
    pub codec: Codec,
    #[serde(default = "default_max_line")]
    pub max_line_bytes: ByteSize,
    #[serde(default = "default_read_buffer")]
    pub read_buffer: ByteSize,
    /// Where to put the client's `ip:port`; absent means nowhere.
    pub peer_field: Option<FieldPath>,
}

fn default_max_line() -> ByteSize {
    ByteSize(1 << 20)
}
fn default_read_buffer() -> ByteSize {
    ByteSize(256 << 10)
}
/// A connection that sends nothing for this long is closed.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Reads and checks the input's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<(Listener, TcpConfig), ConfigError> {
    let (listener, config): (Listener, TcpConfig) = Listener::read(spec, DEFAULT_IDLE_TIMEOUT)?;
    if config.max_line_bytes.0 == 0 {
        return Err(spec.key_error("max_line_bytes", "must be at least 1 byte"));
    }
    if config.read_buffer.0 < 1024 || config.read_buffer.0 > 64 << 20 {
        return Err(spec.key_error("read_buffer", "must be between 1KiB and 64MiB"));
    }
    Ok((listener, config))
}
