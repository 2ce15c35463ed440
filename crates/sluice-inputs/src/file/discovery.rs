//! Finding the files to read: `include` / `exclude` globs, a directory walk, and filesystem
//! notifications.
//!
//! A glob's walk starts at its longest literal directory prefix and goes only as deep as the
//! pattern can match (any depth with `**`). Directory symlinks are not followed (no cycles);
//! file symlinks are, and the file they point to is what gets its identity. Notifications only
//! say "look again soon": the walk is the source of truth, which is why it also runs every
//! `scan_interval` in case a notification was lost (queue overflow, network filesystems).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use notify::{RecursiveMode, Watcher};

/// One file found by a walk.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub path: PathBuf,
    pub meta: std::fs::Metadata,
}

#[derive(Debug)]
pub(crate) struct Patterns {
    include: GlobSet,
    exclude: GlobSet,
    /// Where each include pattern's walk starts, and how deep it may go (None: any depth).
    roots: Vec<(PathBuf, Option<usize>)>,
}

/// What is wrong with the `index`-th pattern of a list.
#[derive(Debug)]
pub(crate) struct BadPattern {
    pub index: usize,
    pub message: String,
}

fn glob(pattern: &str) -> Result<Glob, String> {
    GlobBuilder::new(pattern).literal_separator(true).backslash_escape(true).build().map_err(|e| e.to_string())
}

/// Patterns relative to `cwd` when they are not absolute. An exclude pattern starting with
/// `**` matches anywhere as it is.
fn absolute(pattern: &str, cwd: &Path, is_include: bool) -> String {
    if Path::new(pattern).is_absolute() || (!is_include && pattern.starts_with("**")) {
        pattern.to_string()
    } else {
        cwd.join(pattern).to_string_lossy().into_owned()
    }
}

impl Patterns {
    pub(crate) fn new(include: &[String], exclude: &[String], cwd: &Path) -> Result<Patterns, (bool, BadPattern)> {
        let mut inc = GlobSetBuilder::new();
        let mut roots = Vec::new();
        for (index, p) in include.iter().enumerate() {
            if p.trim().is_empty() {
                return Err((true, BadPattern { index, message: "empty pattern".into() }));
            }
            let abs = absolute(p, cwd, true);
            let g = glob(&abs).map_err(|message| (true, BadPattern { index, message }))?;
            inc.add(g);
            roots.push(walk_root(&abs));
        }
        let mut exc = GlobSetBuilder::new();
        for (index, p) in exclude.iter().enumerate() {
            let g = glob(&absolute(p, cwd, false)).map_err(|message| (false, BadPattern { index, message }))?;
            exc.add(g);
        }
        let build = |b: GlobSetBuilder, is_include| {
            b.build().map_err(|e| (is_include, BadPattern { index: 0, message: e.to_string() }))
        };
        Ok(Patterns { include: build(inc, true)?, exclude: build(exc, false)?, roots })
    }

    pub(crate) fn matches(&self, path: &Path) -> bool {
        self.include.is_match(path) && !self.exclude.is_match(path)
    }

    /// Directories to watch for notifications, with whether to watch them recursively.
    pub(crate) fn watch_roots(&self) -> Vec<(PathBuf, bool)> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (root, depth) in &self.roots {
            let recursive = depth.is_none_or(|d| d > 1);
            if seen.insert((root.clone(), recursive)) {
                out.push((root.clone(), recursive));
            }
        }
        out
    }

    /// Walks every include root; regular files that match come back with their metadata.
    /// Directories that cannot be read are reported through `warn` (once per walk each).
    pub(crate) fn walk(&self, warn: &mut impl FnMut(&Path, &std::io::Error)) -> Vec<Found> {
        let mut out = Vec::new();
        let mut seen: HashSet<PathBuf> = HashSet::new();
        let mut visited: HashSet<PathBuf> = HashSet::new();
        for (root, depth) in &self.roots {
            self.walk_dir(root, depth.unwrap_or(usize::MAX), &mut visited, &mut seen, &mut out, warn);
        }
        out
    }

    fn walk_dir(
        &self,
        dir: &Path,
        depth: usize,
        visited: &mut HashSet<PathBuf>,
        seen: &mut HashSet<PathBuf>,
        out: &mut Vec<Found>,
        warn: &mut impl FnMut(&Path, &std::io::Error),
    ) {
        if depth == 0 || !visited.insert(dir.to_path_buf()) {
            return;
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => return warn(dir, &e),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                self.walk_dir(&path, depth - 1, visited, seen, out, warn);
                continue;
            }
            if !self.matches(&path) || !seen.insert(path.clone()) {
                continue;
            }
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() => out.push(Found { path, meta }),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn(&path, &e),
            }
        }
    }
}

/// The literal directory a pattern starts in, and how many more levels it can descend.
fn walk_root(pattern: &str) -> (PathBuf, Option<usize>) {
    let mut root = PathBuf::new();
    let mut rest: Vec<String> = Vec::new();
    for c in Path::new(pattern).components() {
        let s = c.as_os_str().to_string_lossy();
        let wild = s.contains(['*', '?', '[', '{', '\\']);
        if rest.is_empty() && !wild {
            root.push(c);
        } else {
            rest.push(s.into_owned());
        }
    }
    if rest.is_empty() {
        // A plain file name: its directory is the root.
        if let Some(f) = root.file_name() {
            rest.push(f.to_string_lossy().into_owned());
        }
        root.pop();
    }
    let any_depth = rest.iter().any(|c| c == "**");
    (root, if any_depth { None } else { Some(rest.len()) })
}

/// Filesystem notifications, reduced to "these paths changed" and "look at everything".
pub(crate) struct Notifications {
    _watcher: Option<notify::RecommendedWatcher>,
    rx: mpsc::Receiver<notify::Result<notify::Event>>,
    /// Roots that did not exist or could not be watched yet.
    pub(crate) missing: Vec<(PathBuf, bool)>,
}

pub(crate) enum Change {
    Paths(Vec<PathBuf>),
    /// Events were lost (queue overflow) or the watcher failed: rescan.
    Rescan,
}

impl Notifications {
    pub(crate) fn start(roots: Vec<(PathBuf, bool)>) -> Result<Notifications, notify::Error> {
        let (tx, rx) = mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |r| {
            let _ = tx.send(r);
        })?;
        let mut missing = Vec::new();
        for (root, recursive) in roots {
            let mode = if recursive { RecursiveMode::Recursive } else { RecursiveMode::NonRecursive };
            if watcher.watch(&root, mode).is_err() {
                missing.push((root, recursive));
            }
        }
        Ok(Notifications { _watcher: Some(watcher), rx, missing })
    }

    /// Without notifications (they could not start): the walk alone finds changes.
    pub(crate) fn disabled() -> Notifications {
        let (_tx, rx) = mpsc::channel();
        Notifications { _watcher: None, rx, missing: Vec::new() }
    }

    /// Tries again to watch roots that were missing (created since).
    pub(crate) fn retry_missing(&mut self) -> bool {
        let Some(w) = self._watcher.as_mut() else { return false };
        let before = self.missing.len();
        self.missing.retain(|(root, recursive)| {
            let mode = if *recursive { RecursiveMode::Recursive } else { RecursiveMode::NonRecursive };
            w.watch(root, mode).is_err()
        });
        self.missing.len() < before
    }

    /// Waits up to `timeout` for the first change, then takes everything else already queued.
    pub(crate) fn wait(&self, timeout: std::time::Duration, out: &mut Vec<Change>) {
        match self.rx.recv_timeout(timeout) {
            Ok(r) => out.push(convert(r)),
            Err(_) => return,
        }
        self.drain(out);
    }

    pub(crate) fn drain(&self, out: &mut Vec<Change>) {
        while let Ok(r) = self.rx.try_recv() {
            out.push(convert(r));
        }
    }
}

fn convert(r: notify::Result<notify::Event>) -> Change {
    match r {
        Ok(e) if e.need_rescan() => Change::Rescan,
        Ok(e) => Change::Paths(e.paths),
        Err(_) => Change::Rescan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_depths() {
        assert_eq!(walk_root("/var/log/*.log"), (PathBuf::from("/var/log"), Some(1)));
        assert_eq!(walk_root("/var/log/**/*.log"), (PathBuf::from("/var/log"), None));
        assert_eq!(walk_root("/var/*/x/*.log"), (PathBuf::from("/var"), Some(3)));
        assert_eq!(walk_root("/var/log/app.log"), (PathBuf::from("/var/log"), Some(1)));
    }

    #[test]
    fn walk_matches_includes_minus_excludes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        for f in ["x.log", "x.gz", "a/y.log", "a/b/z.log", "a/b/skip.log"] {
            std::fs::write(d.join(f), "1\n").unwrap();
        }
        let p = Patterns::new(&["**/*.log".into()], &["**/skip*".into()], d).unwrap();
        let mut found: Vec<_> =
            p.walk(&mut |_, _| {}).into_iter().map(|f| f.path.strip_prefix(d).unwrap().to_path_buf()).collect();
        found.sort();
        assert_eq!(found, [PathBuf::from("a/b/z.log"), PathBuf::from("a/y.log"), PathBuf::from("x.log")]);
        let p = Patterns::new(&["*.log".into()], &[], d).unwrap();
        assert_eq!(p.walk(&mut |_, _| {}).len(), 1, "a single `*` stays in its directory");
        let e = Patterns::new(&["a/[b".into()], &[], d).unwrap_err();
        assert!(e.0 && e.1.index == 0, "{}", e.1.message);
    }
}
