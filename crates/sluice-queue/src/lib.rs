//! Queues between a pipeline's inputs and its workers.
//!
//! - [`memory::MemoryQueue`]: bounded by events and by bytes; a full queue makes inputs wait
//!   (backpressure). Acknowledgements pass through it untouched, so with a memory queue an
//!   input hears about its events when every output has handled them.
//!
//! - [`persisted::PersistedQueue`]: sharded, checksummed segment logs on disk, group-committed;
//!   inputs are acknowledged once their events are fsynced, and a restart resumes from each
//!   shard's checkpoint.
//!
//! [`build`] reads the `queue:` section of a pipeline.

use std::path::Path;
use std::sync::Arc;

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Queue;

pub mod memory;
pub mod persisted;

pub const TYPES: &[&str] = &["memory", "persisted"];

/// Builds the queue a pipeline's `queue:` section describes.
/// Nothing is opened here: a persisted queue opens its directory in [`Queue::start`].
pub fn build(spec: &ComponentSpec, pipeline: &str, data_dir: &Path) -> Result<Arc<dyn Queue>, ConfigError> {
    build_beside(spec, pipeline, data_dir, None)
}

/// The queue a pipeline in cluster mode takes its peers' forwarded events into: of the same
/// kind and settings as its own queue, so they are taken exactly as its inputs' events are;
/// persisted beside it, in `<its path>.forwarded`.
pub fn build_forwarded(spec: &ComponentSpec, pipeline: &str, data_dir: &Path) -> Result<Arc<dyn Queue>, ConfigError> {
    build_beside(spec, pipeline, data_dir, Some("forwarded"))
}

fn build_beside(
    spec: &ComponentSpec,
    pipeline: &str,
    data_dir: &Path,
    suffix: Option<&str>,
) -> Result<Arc<dyn Queue>, ConfigError> {
    match spec.type_name.as_str() {
        "memory" => Ok(Arc::new(memory::MemoryQueue::from_config(spec.settings()?).map_err(|m| spec.error(m))?)),
        "persisted" => {
            let config: persisted::PersistedQueueConfig = spec.settings()?;
            let mut settings = config.settings(data_dir, pipeline).map_err(|m| spec.error(m))?;
            if let Some(suffix) = suffix {
                let mut name = settings.path.file_name().unwrap_or_default().to_os_string();
                name.push(format!(".{suffix}"));
                settings.path.set_file_name(name);
            }
            Ok(Arc::new(persisted::PersistedQueue::new(settings)))
        }
        other => Err(spec.error(format!(
            "unknown queue type `{other}`, expected one of {}",
            TYPES.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
        ))),
    }
}
