//! Fuzz target bodies for every parser in Sluice that reads bytes from outside the process:
//! segment frames and the binary event codec, whole persisted-queue directories (segment files
//! and checkpoints, read as `sluice queue verify` reads them), registry snapshots and op logs,
//! dead letter entries, the YAML config loader, the condition and template languages, the line
//! framing and the `lines` / `json_lines` codecs, the http input's request bodies and the beats
//! input's frames.
//!
//! Each target is a plain `pub fn(&[u8])` so that two callers share it: the cargo-fuzz targets
//! in the repository's `fuzz/` directory (nightly, libFuzzer) and the stable test
//! `tests/corpus.rs`, which replays every file under `corpus/<target>/` in the normal test run.
//!
//! What the targets guarantee to check, on any input: the parser returns (no panic, no endless
//! loop); what it accepts survives a round trip through its encoder where one exists
//! (`decode(encode(decode(x)))` encodes to the same bytes); stateful and stateless decoders
//! agree; an error can be rendered as text; and readers that promise not to write leave their
//! files untouched. A failed check is a panic, which is what libFuzzer and the test report.

mod beats;
pub mod checksums;
mod config;
mod dlq;
mod expr;
mod http;
mod lines;
mod queue;
mod registry;
mod segment;
pub mod split;

pub use beats::beats_frames;
pub use config::config;
pub use dlq::dlq_entry;
pub use expr::expr;
pub use http::http_body;
pub use lines::line_codecs;
pub use queue::queue_dir;
pub use registry::registry_files;
pub use segment::segment_codec;

/// A fuzz target body.
pub type Target = fn(&[u8]);

/// Every target by name; the name is also its corpus directory and its cargo-fuzz binary.
pub const TARGETS: &[(&str, Target)] = &[
    ("segment_codec", segment_codec),
    ("queue_dir", queue_dir),
    ("registry_files", registry_files),
    ("dlq_entry", dlq_entry),
    ("config", config),
    ("expr", expr),
    ("line_codecs", line_codecs),
    ("http_body", http_body),
    ("beats_frames", beats_frames),
];
