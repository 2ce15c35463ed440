//! The component kinds this build knows, seen together: each component crate keeps the table of
//! its kind ([`sluice_inputs::KINDS`], [`sluice_processors::KINDS`], [`sluice_outputs::KINDS`]:
//! name, builder, links), next to the modules it lists, so that the crate's own tests, benches
//! and examples build components the way the topology does; the topology builds, links and
//! checks every component through those tables only, never by a type name or a key.
//!
//! Adding a component: its module (`<name>/{mod.rs, config.rs, tests.rs}`) in the crate of its
//! kind, one line in that crate's `KINDS`, and a `## <name>` section in `docs/inputs.md`,
//! `docs/processors.md` or `docs/outputs.md`; the test below fails without the section.

use sluice_core::metrics::ComponentKind;

/// Every component `type` of this build, with its kind.
pub fn all() -> impl Iterator<Item = (ComponentKind, &'static str)> {
    let inputs = sluice_inputs::KINDS.iter().map(|k| (ComponentKind::Input, k.name));
    let processors = sluice_processors::KINDS.iter().map(|k| (ComponentKind::Processor, k.name));
    let outputs = sluice_outputs::KINDS.iter().map(|k| (ComponentKind::Output, k.name));
    inputs.chain(processors).chain(outputs)
}

/// The component names a docs page has a section for: a `## ` heading names one by its first
/// word (`## grok`) or in backticks (``## `elasticsearch` (also `opensearch`)``).
#[cfg(test)]
fn documented(page: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut in_code = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        let Some(heading) = line.strip_prefix("## ").filter(|_| !in_code) else { continue };
        if let Some(first) = heading.split_whitespace().next() {
            names.insert(first.trim_matches('`').to_string());
        }
        names.extend(heading.split('`').skip(1).step_by(2).map(str::to_string));
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(kind: ComponentKind) -> (String, String) {
        let name = match kind {
            ComponentKind::Input => "inputs.md",
            ComponentKind::Processor => "processors.md",
            ComponentKind::Output => "outputs.md",
        };
        let path = format!("{}/../../docs/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        (format!("docs/{name}"), text)
    }

    #[test]
    fn every_component_has_a_section_in_the_docs() {
        let mut missing = Vec::new();
        for (kind, name) in all() {
            let (file, text) = page(kind);
            if !documented(&text).contains(name) {
                missing.push(format!("{file}: no `## {name}` section"));
            }
        }
        assert!(missing.is_empty(), "components without docs:\n{}", missing.join("\n"));
    }

    #[test]
    fn sections_are_found_as_the_docs_write_them() {
        let page = "# Outputs\n## Common keys\n## `file`\n## `elasticsearch` (also `opensearch`)\n## grok\n\
                    ```yaml\n## not_a_section\n```\n### `retry`\n";
        let found = documented(page);
        for name in ["file", "elasticsearch", "opensearch", "grok"] {
            assert!(found.contains(name), "{name}: {found:?}");
        }
        for name in ["not_a_section", "retry", "tcp"] {
            assert!(!found.contains(name), "{name}: {found:?}");
        }
    }
}
