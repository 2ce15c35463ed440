//! Replays every corpus file of every fuzz target on stable, so that a change that makes a
//! parser panic (or break a round trip) on an input fuzzing once found is caught by the normal
//! test run, without nightly. Each target's corpus must exist and hold files, and each target
//! must have its cargo-fuzz binary, so that neither can be lost quietly.

use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use sluice_fuzz::TARGETS;

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus of `{target}` ({}) cannot be listed: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_of_every_target_passes() {
    let mut failures = Vec::new();
    let mut replayed = 0;
    for &(name, target) in TARGETS {
        let files = corpus_files(name);
        assert!(!files.is_empty(), "the corpus of `{name}` is empty");
        for file in files {
            let data = fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| target(&data))) {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{name}: {}: {message}", file.display()));
            }
            replayed += 1;
        }
    }
    assert!(failures.is_empty(), "{} of {replayed} corpus files fail:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_target_has_a_cargo_fuzz_binary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fuzz_targets");
    for &(name, _) in TARGETS {
        let file = dir.join(format!("{name}.rs"));
        let source = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            source.contains(&format!("sluice_fuzz::{name}(")),
            "{} does not call sluice_fuzz::{name}",
            file.display()
        );
    }
}
