//! `file` input: tails files matched by globs, resumes exactly where acknowledged events end.
//!
//! One dedicated reader thread (blocking file I/O never runs on the async workers) does the
//! file work: it walks the globs (at start, every `scan_interval`, and soon after a filesystem
//! notification), opens files up to `max_open_files`, and reads the files that may have data in
//! turns of at most `read_buffer` bytes each, so a busy file cannot starve the others, and
//! cuts lines. Plain lines then become events on a few builder threads (see [`builders`]), which
//! push them in read order; with `multiline` the reader joins and builds them itself. Each
//! file's share of a batch carries its own acknowledgement, and a file's offset is committed to
//! the registry only once every event before it is acknowledged (see [`acks`]).
//!
//! Layout: [`config`] reads the settings, [`harvester`] is the reader thread, [`reader`] reads
//! a file in turns, [`framing`] cuts its lines, [`events`] makes them events, and [`builders`]
//! does that on more threads.
//!
//! Guarantees:
//! - At-least-once: an offset is committed only after the events before it reached the ack
//!   point (durable in a persisted queue, or delivered with a memory queue). After a crash,
//!   events after the last offset the registry wrote out are read again (duplicates bounded by
//!   the registry's flush interval), never lost.
//! - Identity is device + inode checked against a fingerprint of the first KiB (see
//!   [`identity`]): a rotated (renamed) file keeps its offset and is read to its end; a new
//!   file at the old path is a new file; a truncated file (copytruncate), a file rewritten in
//!   place, and a reused inode are detected and read again from offset 0, with a warning
//!   naming the path.
//! - Unreadable files and directories are reported (warn, with the path) once and retried at
//!   every scan; nothing here panics on bad input.

mod acks;
mod builders;
mod config;
mod decode;
mod discovery;
mod events;
mod framing;
mod harvester;
mod identity;
mod lag;
mod multiline;
mod reader;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use crate::{Input, InputContext, InputError};
use config::Settings;
use harvester::Harvester;

struct FileInput {
    settings: Settings,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    Ok(Box::new(FileInput { settings: config::read(spec)? }))
}

#[async_trait]
impl Input for FileInput {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let positions = ctx.registry.clone();
        let handle = tokio::runtime::Handle::current();
        let settings = self.settings;
        tokio::task::spawn_blocking(move || Harvester::new(settings, ctx, positions, handle).run())
            .await
            .map_err(|e| InputError(format!("file input reader thread failed: {e}")))?
    }

    fn uses_registry(&self) -> bool {
        true
    }
}
