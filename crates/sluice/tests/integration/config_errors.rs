//! `sluice validate` and `sluice run` on bad configs: one test per class of error, each
//! asserting the message names the file, line, column and key path at fault.

use crate::common;

use common::validate;

fn invalid(config: &str) -> String {
    let (ok, text) = validate(config);
    assert!(!ok, "expected the config to be refused:\n{config}\n---\n{text}");
    text
}

const OK_PIPE: &str = "    inputs: [{type: generator, count: 1}]\n    outputs: [{type: blackhole}]\n";

#[test]
fn a_valid_config_passes() {
    let (ok, text) = validate(&format!("pipelines:\n  web:\n{OK_PIPE}"));
    assert!(ok, "{text}");
    assert!(text.contains("valid (1 pipeline(s): web)"), "{text}");
}

#[test]
fn unknown_keys_name_their_path_and_line() {
    let text = invalid(
        "pipelines:\n  web:\n    inputs: [{type: generator, count: 1}]\n    outputs:\n      - type: blackhole\n      - type: stdout\n        hosts: [a]\n",
    );
    assert!(
        text.contains("check.yml:7:9: pipelines.web.outputs[1].hosts: unknown field `hosts`, expected `codec`"),
        "{text}"
    );
    let text = invalid(&format!("pipelines:\n  web:\n{OK_PIPE}    wrokers: 2\n"));
    assert!(text.contains("check.yml:5:5: pipelines.web.wrokers: unknown key `wrokers`"), "{text}");
}

#[test]
fn wrong_types_say_what_was_expected() {
    let text = invalid(&format!("pipelines:\n  web:\n{OK_PIPE}    batch: {{size: many}}\n"));
    assert!(text.contains("check.yml:5:19: pipelines.web.batch.size: expected a whole number, found `many`"), "{text}");
    let text =
        invalid("pipelines:\n  web:\n    inputs: [{type: generator, count: -3}]\n    outputs: [{type: blackhole}]\n");
    assert!(text.contains("pipelines.web.inputs[0].count: expected a whole number, found `-3`"), "{text}");
    let text = invalid(
        "pipelines:\n  web:\n    inputs: [{type: generator, count: 1}]\n    outputs: [{type: blackhole, print_interval: 10}]\n",
    );
    assert!(text.contains("pipelines.web.outputs[0].print_interval: `10` has no unit: write 10ms or 10s"), "{text}");
}

#[test]
fn unknown_component_types_list_the_known_ones() {
    let text = invalid("pipelines:\n  web:\n    inputs: [{type: kafkaa}]\n    outputs: [{type: blackhole}]\n");
    assert!(
        text.contains("check.yml:3:14: pipelines.web.inputs[0]: unknown input type `kafkaa`, expected one of"),
        "{text}"
    );
}

#[test]
fn dangling_and_duplicate_pipeline_addresses() {
    let text = invalid(
        "pipelines:\n  a:\n    inputs: [{type: generator, count: 1}]\n    outputs: [{type: pipeline, send_to: nowhere}]\n",
    );
    assert!(
        text.contains("pipelines.a.outputs[0].send_to: no pipeline has a `pipeline` input with address `nowhere`"),
        "{text}"
    );
    let text = invalid(
        "pipelines:\n  a:\n    inputs: [{type: pipeline, address: x}]\n    outputs: [{type: blackhole}]\n  b:\n    inputs: [{type: pipeline, address: x}]\n    outputs: [{type: blackhole}]\n",
    );
    assert!(
        text.contains("pipelines.b.inputs[0].address: pipeline address `x` is already served by pipeline `a`"),
        "{text}"
    );
}

#[test]
fn pipelines_feeding_each_other_in_a_loop() {
    let text = invalid(
        "pipelines:\n  a:\n    inputs: [{type: pipeline, address: to-a}]\n    outputs: [{type: pipeline, send_to: to-b}]\n  b:\n    inputs: [{type: pipeline, address: to-b}]\n    outputs: [{type: pipeline, send_to: to-a}]\n",
    );
    assert!(text.contains("pipelines feed each other in a loop: a -> b -> a"), "{text}");
}

#[test]
fn bad_conditions_point_at_the_column() {
    let text = invalid(&format!(
        "pipelines:\n  web:\n{OK_PIPE}    processors:\n      - {{type: drop, if: '/status >= and /x'}}\n"
    ));
    assert!(text.contains("check.yml:6:26: pipelines.web.processors[0].if: invalid condition:"), "{text}");
    assert!(text.contains("at column 12 in `/status >= and /x`"), "{text}");
    let text = invalid(&format!(
        "pipelines:\n  web:\n{OK_PIPE}    processors:\n      - {{type: drop, if: '/path =~ \"(unclosed\"'}}\n"
    ));
    assert!(text.contains("pipelines.web.processors[0].if: invalid condition:"), "{text}");
}

#[test]
fn missing_environment_variables_are_named() {
    let text = invalid(
        "pipelines:\n  web:\n    inputs: [{type: tcp, address: '${SLUICE_TEST_SURELY_UNSET}'}]\n    outputs: [{type: blackhole}]\n",
    );
    assert!(text.contains("check.yml:3:35: environment variable `SLUICE_TEST_SURELY_UNSET` is not set"), "{text}");
    let (ok, text) = validate(
        "pipelines:\n  web:\n    inputs: [{type: generator, count: '${SLUICE_TEST_SURELY_UNSET:-5}'}]\n    outputs: [{type: blackhole}]\n",
    );
    assert!(ok, "a default makes it valid: {text}");
}

#[test]
fn yaml_syntax_errors_have_a_place() {
    let text = invalid("pipelines:\n  web:\n    inputs: [{type: generator\n    outputs: []\n");
    assert!(text.contains("check.yml:") && text.contains("invalid YAML"), "{text}");
}

#[test]
fn every_error_is_listed_at_once() {
    let text = invalid(
        "pipelines:\n  web:\n    inputs: [{type: nope}]\n    outputs: [{type: blackhole, bogus: 1}]\n    processors: [{type: drop, if: '(('}]\n",
    );
    assert!(text.contains("3 error(s)"), "{text}");
}

#[test]
fn run_refuses_a_bad_config_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yml");
    std::fs::write(&path, "pipelines: {}\n").unwrap();
    let out = std::process::Command::new(common::BIN).args(["run", "-c", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pipelines: `pipelines` is empty: a config defines at least one pipeline"), "{stderr}");
}

#[test]
fn a_second_stdin_input_is_refused_naming_the_first() {
    let text = invalid(
        "pipelines:\n  a:\n    inputs: [{type: stdin}]\n    outputs: [{type: blackhole}]\n  b:\n    inputs: [{type: generator, count: 1}, {type: stdin}]\n    outputs: [{type: blackhole}]\n",
    );
    assert!(
        text.contains(
            "check.yml:6:43: pipelines.b.inputs[1]: only one `stdin` input may run in a process, and pipelines.a.inputs[0] already reads stdin"
        ),
        "{text}"
    );
    let text = invalid(
        "pipelines:\n  a:\n    inputs: [{type: stdin}, {type: stdin, id: again}]\n    outputs: [{type: blackhole}]\n",
    );
    assert!(text.contains("pipelines.a.inputs[1]: only one `stdin` input") && text.contains("1 error(s)"), "{text}");
}

#[test]
fn pipeline_level_and_component_errors_are_listed_in_one_pass() {
    let text = invalid(
        "pipelines:\n  web:\n    wrokers: 2\n    inputs: [{type: generator, count: 1}]\n    processors: [{type: json, bogus: 1}]\n    outputs: [{type: blackhole}]\n",
    );
    assert!(text.contains("check.yml:3:5: pipelines.web.wrokers: unknown key `wrokers`"), "{text}");
    assert!(text.contains("check.yml:5:31: pipelines.web.processors[0].bogus: unknown field `bogus`"), "{text}");
    assert!(text.contains("2 error(s)"), "{text}");

    // A component that cannot be read at all: the others are still built, and the link to the
    // pipeline it belongs to is not reported as dangling.
    let text = invalid(
        "pipelines:\n  a:\n    inputs: [{type: generator, count: 1}]\n    processors: [{type: drop, if: '(('}]\n    outputs: [{type: pipeline, send_to: b}]\n  b:\n    inputs: [{type: pipeline, address: b, id: [x]}]\n    outputs: [{type: blackhole}]\n",
    );
    assert!(text.contains("pipelines.a.processors[0].if: invalid condition:"), "{text}");
    assert!(text.contains("pipelines.b.inputs[0].id: expected text"), "{text}");
    assert!(!text.contains("no pipeline has"), "{text}");
    assert!(text.contains("2 error(s)"), "{text}");
}

/// The sections read by their own crates (`registry:`, a pipeline's `dead_letter_queue:`) and
/// the keys shared by every network input still name the file, line and key, whether the rest
/// of the config is readable or not (a component missing its `type` leaves the config partial).
#[test]
fn sections_read_by_their_crates_name_their_place() {
    for partial in ["", "      - {id: no_type}\n"] {
        let text = invalid(&format!(
            "registry:\n  compact_after: 10\npipelines:\n  web:\n    inputs:\n      - {{type: generator, count: 1}}\n{partial}    outputs: [{{type: blackhole}}]\n    dead_letter_queue:\n      enabled: true\n      max_bytes: 10\n"
        ));
        assert!(
            text.contains(
                "check.yml:2:18: registry.compact_after: `compact_after` of 10B is too small; use at least 4KiB"
            ),
            "{text}"
        );
        let line = if partial.is_empty() { 10 } else { 11 };
        assert!(
            text.contains(&format!(
                "check.yml:{line}:18: pipelines.web.dead_letter_queue.max_bytes: must be at least 1KiB"
            )),
            "{text}"
        );
    }
    let text = invalid(&format!("registry: {{flush_intervall: 1s}}\npipelines:\n  web:\n{OK_PIPE}"));
    assert!(text.contains("check.yml:1:12: registry.flush_intervall: unknown field `flush_intervall`"), "{text}");

    for (input, place) in [
        (
            "{type: tcp, address: 'h:1', max_connections: 0}",
            "3:59: pipelines.web.inputs[0].max_connections: must be at least 1",
        ),
        ("{type: beats, address: nowhere}", "3:37: pipelines.web.inputs[0].address: `nowhere` is not a `host:port`"),
        (
            "{type: http, address: 'h:1', idle_timeout: 7}",
            "3:57: pipelines.web.inputs[0].idle_timeout: `7` has no unit",
        ),
        (
            "{type: syslog, mode: udp, address: 'h:1', idle_timeout: 1s}",
            "3:70: pipelines.web.inputs[0].idle_timeout: `idle_timeout` applies to `mode: tcp` only",
        ),
        (
            "{type: tcp, address: 'h:1', tls: {enabled: true, cert: /nonexistent/c.pem, key: /nonexistent/k.pem, colour: red}}",
            "pipelines.web.inputs[0].tls.colour: unknown field `colour`",
        ),
        (
            "{type: tcp, address: 'h:1', adress: 'h:2'}",
            "3:42: pipelines.web.inputs[0].adress: unknown field `adress`, expected one of `codec`",
        ),
    ] {
        let text = invalid(&format!("pipelines:\n  web:\n    inputs: [{input}]\n    outputs: [{{type: blackhole}}]\n"));
        assert!(text.contains(place), "{input}: {text}");
    }
}
