//! Every config under examples/ validates, so the documentation's configs keep working.

use crate::common;

#[test]
fn every_example_validates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yml" || e == "yaml") {
            let out = std::process::Command::new(common::BIN).args(["validate", "-c"]).arg(&path).output().unwrap();
            assert!(
                out.status.success(),
                "{} does not validate:\n{}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "expected the examples to be there, found {checked}");
}
