//! What a test that needs root does where root is not to be had: it fails, naming what it
//! needed, unless `SLUICE_SKIP_ROOT_TESTS=1` says to skip such tests; then it says so on the
//! terminal (past libtest's capture, so a skip is seen even though the test passes) and checks
//! nothing. CI does not set the variable: there, a root-only test that cannot run is a failure.

use std::io::Write;

/// The environment variable that turns a root-only test's failure to run into a skip.
pub const SKIP_ROOT_VAR: &str = "SLUICE_SKIP_ROOT_TESTS";

/// Whether `SLUICE_SKIP_ROOT_TESTS` is set to `1` (or `true`/`yes`).
pub fn skipping_root_tests() -> bool {
    std::env::var(SKIP_ROOT_VAR).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// Called when `what` (a tmpfs, a network namespace), which needs root, could not be had
/// because of `why`: panics with both, or, under `SLUICE_SKIP_ROOT_TESTS=1`, says on the
/// terminal that the test is skipped and returns (the caller then returns too).
///
/// # Panics
/// Unless `SLUICE_SKIP_ROOT_TESTS=1`.
pub fn root_unavailable(what: &str, why: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    if skipping_root_tests() {
        // Straight to the stream, not through `eprintln!`: libtest hides a passing test's output.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: it needs {what}, and: {why} ({SKIP_ROOT_VAR} is set; this test checked nothing)"
        );
        return;
    }
    panic!(
        "{test} cannot run: it needs {what}, and: {why}. Run the tests as root with what they need installed \
         (README.md), or set {SKIP_ROOT_VAR}=1 to skip the tests that need root"
    );
}
