//! Records the commit the binary is built from (for `sluice version`, `sluice_build_info` and
//! `/stats`): `SLUICE_COMMIT` if the builder sets it (a build outside a git checkout), else
//! `git rev-parse`, else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_COMMIT");
    let commit = std::env::var("SLUICE_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        let out = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    // A new commit changes HEAD (or the branch file it names): build again then.
    if let Ok(out) = Command::new("git").args(["rev-parse", "--git-dir"]).output()
        && out.status.success()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Ok(head) = std::fs::read_to_string(format!("{dir}/HEAD"))
            && let Some(branch) = head.trim().strip_prefix("ref: ")
        {
            println!("cargo:rerun-if-changed={dir}/{branch}");
        }
    }
    println!("cargo:rustc-env=SLUICE_COMMIT={}", commit.unwrap_or_else(|| "unknown".to_string()));
}
