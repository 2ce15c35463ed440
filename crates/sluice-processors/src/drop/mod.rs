//! `drop`: drops every event it sees. With `if:` it drops the matching ones; dropped events
//! count as handled, so their inputs are acknowledged.

use std::sync::Arc;

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;

use crate::{Processor, Verdict};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DropConfig {}

struct Drop;

impl Processor for Drop {
    fn process(&self, _event: &mut Event) -> Verdict {
        Verdict::Drop
    }
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    let _: DropConfig = spec.settings()?;
    Ok(Arc::new(Drop))
}
