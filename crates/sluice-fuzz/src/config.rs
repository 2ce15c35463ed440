//! The config loader: YAML text to `RootConfig`, with `${VAR}` substitution from a fixed
//! environment, and every error rendered as the message `sluice validate` prints.

use sluice_config::model::from_root;
use sluice_config::parse_yaml_with_env;

const FILE: &str = "fuzz.yml";

/// What `${VAR}` finds: a few plain values, one holding YAML syntax and one holding a
/// reference of its own (substitution is not recursive, so it stays as text).
fn lookup(name: &str) -> Option<String> {
    let value = match name {
        "PORT" => "5000",
        "EMPTY" => "",
        "YAML" => "{a: [1, 2], b: \"x\"}\n- item",
        "NESTED" => "${PORT}",
        "DIR" => "/var/lib/sluice",
        _ => return None,
    };
    Some(value.to_string())
}

/// Reads `data` (as UTF-8, invalid bytes replaced, as a file that decodes would be) as a
/// config. Every error names the file and can be displayed.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let root = match parse_yaml_with_env(&text, FILE, &lookup) {
        Ok(root) => root,
        Err(e) => {
            check_error(&e.to_string(), e.mark.is_some());
            return;
        }
    };
    if let Err(errors) = from_root(&root) {
        assert!(!errors.0.is_empty(), "a failed load with no error");
        for e in &errors.0 {
            check_error(&e.to_string(), e.mark.is_some());
        }
    }
}

fn check_error(message: &str, has_mark: bool) {
    assert!(!message.is_empty(), "an empty error message");
    if has_mark {
        assert!(message.starts_with(FILE), "an error with a place does not name the file: {message}");
    }
}
