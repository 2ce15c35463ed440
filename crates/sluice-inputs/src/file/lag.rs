//! The file input's lag: for each plain file it reads, the bytes between its read position and
//! the file's size as last seen (at its last stat: on opening it, and each time the reader
//! comes back to it at its end). Published by the reader thread before each batch it pushes
//! and, while idle, once per [`PUBLISH_EVERY`]: the sum as a gauge, and the [`LARGEST`] files
//! furthest behind in `/stats`, so that the figure stays bounded however many files match.
//! While the pipeline holds the reader back, the figure is the one of its last push. Gzip
//! files are left out: their read position counts decompressed bytes.

use std::path::Path;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::figures::{Figure, Publish, Spec, Unit};

/// How many files `/stats` lists, the furthest behind first.
pub(crate) const LARGEST: usize = 10;
/// How often the reader thread publishes the figures when it pushes nothing.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct FileLag {
    inner: Mutex<Snapshot>,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct Snapshot {
    total: u64,
    largest: Vec<(String, u64)>,
}

impl FileLag {
    /// Replaces the figures with those of `files`: each file's path and bytes behind its end.
    pub(crate) fn publish<'a>(&self, files: impl Iterator<Item = (&'a Path, u64)>) {
        let mut behind: Vec<(&Path, u64)> = files.filter(|(_, lag)| *lag > 0).collect();
        let total = behind.iter().map(|(_, lag)| lag).sum();
        if behind.len() > LARGEST {
            behind.select_nth_unstable_by(LARGEST - 1, |a, b| b.1.cmp(&a.1));
            behind.truncate(LARGEST);
        }
        behind.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let largest = behind.into_iter().map(|(p, lag)| (p.display().to_string(), lag)).collect();
        *self.inner.lock() = Snapshot { total, largest };
    }

    pub(crate) fn total(&self) -> u64 {
        self.inner.lock().total
    }
}

impl Publish for FileLag {
    fn figures(&self) -> Vec<Figure> {
        vec![Spec::gauge("file_lag_bytes", "Bytes of the files a file input reads that it has not read yet (size at the last look minus the read position), summed.").in_unit(Unit::Bytes).value(self.total())]
    }

    fn detail(&self) -> Option<(&'static str, serde_json::Value)> {
        let files: Vec<serde_json::Value> = self
            .inner
            .lock()
            .largest
            .iter()
            .map(|(path, lag)| serde_json::json!({"path": path, "lag_bytes": lag}))
            .collect();
        Some(("file_lag_largest", serde_json::Value::Array(files)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_file_and_lists_only_the_furthest_behind() {
        let lag = FileLag::default();
        let paths: Vec<String> = (0..25).map(|i| format!("/logs/{i:02}.log")).collect();
        lag.publish(paths.iter().enumerate().map(|(i, p)| (Path::new(p.as_str()), i as u64 * 10)));
        assert_eq!(lag.total(), (0..25).map(|i| i * 10).sum::<u64>());
        let s = lag.inner.lock().clone();
        assert_eq!(s.largest.len(), LARGEST);
        assert_eq!(s.largest[0], ("/logs/24.log".to_string(), 240));
        assert_eq!(s.largest[LARGEST - 1], ("/logs/15.log".to_string(), 150));

        // Read to the end: nothing behind, nothing listed.
        lag.publish(paths.iter().map(|p| (Path::new(p.as_str()), 0)));
        assert_eq!(lag.total(), 0);
        assert!(lag.inner.lock().largest.is_empty());
        assert_eq!(lag.figures()[0].count(), 0);
    }
}
