//! Finding the files to read: `include` / `exclude` globs, a directory walk, and filesystem
//! notifications.
//!
//! Patterns are written the one way the walk writes paths before they are compared: made
//! absolute from the working directory, without `.` components or repeated separators, and
//! with each `..` taken away together with the directory before it as the file system does it
//! (after a symbolic link, the link's target's parent). So `./logs/*.log`, `logs//*.log` and
//! `app/../logs/*.log` match the files the walk finds, `include` and `exclude` agree however
//! each is spelled, and the paths events carry hold no `.` or `..`. Symbolic links in a
//! pattern's literal directories are otherwise kept as written and followed at every walk (a
//! link moved to a new target is followed there).
//!
//! A glob's walk starts at its longest literal directory prefix and goes only as deep as the
//! pattern can match (any depth with `**`). Directory symlinks below that prefix are not
//! followed (no cycles); file symlinks are, and the file they point to is what gets its
//! identity. Notifications only
//! say "look again soon": the walk is the source of truth, which is why it also runs every
//! `scan_interval` in case a notification was lost (queue overflow, network filesystems).

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
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

/// Whether a path component holds glob syntax (or an escape), so that it is not literal.
fn is_wild(component: &str) -> bool {
    component.contains(['*', '?', '[', '{', '\\'])
}

/// A pattern as the walk would write the paths it matches: absolute from `cwd`, without `.`
/// components and repeated separators, `..` resolved (see the module's comment). An exclude
/// pattern starting with `**` matches anywhere as it is. A `..` after a wildcard is refused:
/// which directory it leaves depends on what the wildcard matched.
fn normalised(pattern: &str, cwd: &Path, is_include: bool) -> Result<String, String> {
    if !is_include && pattern.starts_with("**") {
        return Ok(pattern.to_string());
    }
    let joined = if Path::new(pattern).is_absolute() { PathBuf::from(pattern) } else { cwd.join(pattern) };
    let mut out = PathBuf::new();
    let mut wild = false;
    // `components` already drops empty components and `.` after the first.
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if wild => {
                return Err("`..` after a wildcard: which directory it leaves depends on the match".into());
            }
            Component::ParentDir => {
                // The file system's `..` of a symbolic link is its target's parent: resolve
                // what exists; below that, nothing can be a link yet.
                if let Ok(real) = std::fs::canonicalize(&out) {
                    out = real;
                }
                out.pop();
            }
            Component::Normal(name) => {
                wild |= is_wild(&name.to_string_lossy());
                out.push(name);
            }
            Component::RootDir | Component::Prefix(_) => out.push(c),
        }
    }
    Ok(out.to_string_lossy().into_owned())
}

impl Patterns {
    pub(crate) fn new(include: &[String], exclude: &[String], cwd: &Path) -> Result<Patterns, (bool, BadPattern)> {
        let mut inc = GlobSetBuilder::new();
        let mut roots = Vec::new();
        for (index, p) in include.iter().enumerate() {
            if p.trim().is_empty() {
                return Err((true, BadPattern { index, message: "empty pattern".into() }));
            }
            let abs = normalised(p, cwd, true).map_err(|message| (true, BadPattern { index, message }))?;
            let g = glob(&abs).map_err(|message| (true, BadPattern { index, message }))?;
            inc.add(g);
            roots.push(walk_root(&abs));
        }
        let mut exc = GlobSetBuilder::new();
        for (index, p) in exclude.iter().enumerate() {
            let abs = normalised(p, cwd, false).map_err(|message| (false, BadPattern { index, message }))?;
            let g = glob(&abs).map_err(|message| (false, BadPattern { index, message }))?;
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

    /// The directories the walks start in, as patterns were normalised, each marked when it is
    /// missing or not a directory: what a warning about an `include` that matches nothing names.
    pub(crate) fn searched(&self) -> String {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (root, _) in &self.roots {
            if !seen.insert(root) {
                continue;
            }
            let state = match std::fs::metadata(root) {
                Ok(m) if m.is_dir() => "",
                Ok(_) => " (not a directory)",
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => " (missing)",
                Err(_) => " (cannot be read)",
            };
            out.push(format!("{}{state}", root.display()));
        }
        out.join(", ")
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
        if rest.is_empty() && !is_wild(&s) {
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
    fn patterns_are_normalised_as_the_walk_writes_paths() {
        let cwd = Path::new("/srv/app");
        let n = |p: &str| normalised(p, cwd, true).unwrap();
        assert_eq!(n("./logs/*.log"), "/srv/app/logs/*.log");
        assert_eq!(n("logs//*.log"), "/srv/app/logs/*.log");
        assert_eq!(n("/var//log/./x/*.log"), "/var/log/x/*.log");
        assert_eq!(n("../other/./*.log"), "/srv/other/*.log");
        assert_eq!(n("/a/b/../../../c/*.log"), "/c/*.log");
        assert_eq!(n("/var/log/{a,b}/**/*.log"), "/var/log/{a,b}/**/*.log");
        assert!(normalised("/var/*/../x.log", cwd, true).unwrap_err().contains("after a wildcard"));
        assert_eq!(normalised("**/*.gz", cwd, false).unwrap(), "**/*.gz");
        assert_eq!(normalised("./skip/*.log", cwd, false).unwrap(), "/srv/app/skip/*.log");

        // `..` after a symbolic link leaves the link's target, as the file system does.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(d.join("real/deep")).unwrap();
        std::os::unix::fs::symlink(d.join("real/deep"), d.join("link")).unwrap();
        assert_eq!(n(&format!("{}/link/../*.log", d.display())), format!("{}/real/*.log", d.display()));
        assert_eq!(n(&format!("{}/link/*.log", d.display())), format!("{}/link/*.log", d.display()), "kept as written");
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
