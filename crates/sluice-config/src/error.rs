//! Configuration errors that say where: file, line, column and key path.

use std::fmt;

use crate::node::Mark;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub message: String,
    /// Dotted key path, `pipelines.web.outputs[1].hosts`; empty until known.
    pub path: String,
    pub mark: Option<Mark>,
}

impl ConfigError {
    pub fn new(message: impl Into<String>) -> ConfigError {
        ConfigError { message: message.into(), path: String::new(), mark: None }
    }

    pub fn at(message: impl Into<String>, path: &str, mark: Mark) -> ConfigError {
        ConfigError { message: message.into(), path: path.to_string(), mark: Some(mark) }
    }

    /// Fills in the place if the error does not know it yet (the innermost place wins).
    pub fn or_at(mut self, path: &str, mark: Mark) -> ConfigError {
        if self.mark.is_none() {
            self.mark = Some(mark);
        }
        if self.path.is_empty() {
            self.path = path.to_string();
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(m) = &self.mark {
            write!(f, "{}:{}:{}: ", m.file, m.line, m.column)?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

impl serde::de::Error for ConfigError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ConfigError::new(msg.to_string())
    }
}

/// Every error found in one configuration, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn push(&mut self, e: ConfigError) {
        self.0.push(e);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn into_result<T>(mut self, ok: T) -> Result<T, ConfigErrors> {
        if self.0.is_empty() {
            Ok(ok)
        } else {
            self.0.sort_by_key(|e| e.mark.as_ref().map(|m| (m.line, m.column)));
            Err(self)
        }
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
