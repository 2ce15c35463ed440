//! `template: {name, file, overwrite}`: an index template (the composable
//! `_index_template` API) put in place before the first bulk request. The file is read and
//! checked to be a JSON object when the output is built. Without `overwrite`, a template of
//! that name already there is left alone.

use reqwest::{StatusCode, Url};
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use super::config::TemplateConfig;

pub struct Install {
    name: String,
    body: bytes::Bytes,
    overwrite: bool,
}

impl Install {
    pub fn read(spec: &ComponentSpec, t: &TemplateConfig) -> Result<Install, ConfigError> {
        let at = |key: &str, m: String| spec.nested_key_error(&["template", key], m);
        if t.name.is_empty() || t.name.contains(['/', ' ', '?', '#', '*', ',']) {
            return Err(at("name", format!("`{}` is not a template name", t.name)));
        }
        let text = std::fs::read(&t.file).map_err(|e| at("file", format!("cannot read {}: {e}", t.file.display())))?;
        let json: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| at("file", format!("{} is not JSON: {e}", t.file.display())))?;
        if !json.is_object() {
            return Err(at("file", format!("{} must hold a JSON object (the template's body)", t.file.display())));
        }
        Ok(Install { name: t.name.clone(), body: bytes::Bytes::from(text), overwrite: t.overwrite })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Puts the template in through `base` (a host's base URL); says what it did.
    pub async fn run(&self, client: &reqwest::Client, base: &Url) -> Result<&'static str, String> {
        let url = base.join(&format!("_index_template/{}", self.name)).map_err(|e| e.to_string())?;
        if !self.overwrite {
            let head = client.head(url.clone()).send().await.map_err(|e| crate::http::describe(&e))?;
            match head.status() {
                StatusCode::OK => return Ok("already there; left as it is (overwrite: false)"),
                StatusCode::NOT_FOUND => {}
                s => return Err(format!("HEAD {url}: HTTP {}", s.as_u16())),
            }
        }
        // The client's default headers say NDJSON and maybe gzip: this body is plain JSON.
        let put = client
            .put(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::CONTENT_ENCODING, "identity")
            .body(self.body.clone())
            .send()
            .await
            .map_err(|e| crate::http::describe(&e))?;
        let status = put.status();
        if status.is_success() {
            Ok(if self.overwrite { "installed (overwrite: true)" } else { "installed" })
        } else {
            let body = put.text().await.unwrap_or_default();
            Err(format!("PUT {url}: HTTP {}: {}", status.as_u16(), body.chars().take(300).collect::<String>()))
        }
    }
}
