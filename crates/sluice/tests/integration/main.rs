//! Sluice's integration tests: the real `sluice` binary run on real configs, files, sockets and
//! servers, one module per subject, all in one test binary (one link, not one per file; the
//! helpers in `common` compile once). `cargo test -p sluice --test integration beats::` runs
//! one module, `... --test integration NAME` the tests whose path contains NAME.
//!
//! Every test here shares its process with the others: nothing sets environment variables or
//! other process-wide state, ports come from `common::free_port` (never handed out twice in the
//! process), and what a test builds once (the Beats client) is built once for all of them.

mod common;

mod beats;
mod cluster;
mod cluster_cli;
mod cluster_partition;
mod config_errors;
mod crash;
mod disk_full;
mod dlq;
mod dlq_full_disk;
mod elasticsearch;
mod engine;
mod examples;
mod file_crash;
mod file_input;
mod hostile_input;
mod io;
mod kafka_input;
mod kafka_output;
mod kafka_security;
mod ordered;
mod output_faults;
mod processors;
mod queue_cli;
mod registry;
mod startup;
mod summary;
mod syslog;
mod tls;
mod tls_peers;
mod top;
