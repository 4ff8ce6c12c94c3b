//! Locating errors: a file's text and name, to place an error at a line and a dotted field;
//! reading a file; durations as the files write them.

use std::path::Path;
use std::time::Duration;

/// What was wrong with a policy file, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: `{field}`: {reason}")]
pub struct ConfigError {
    /// The file (or the origin given to [`crate::config::GatewayConfig::from_toml_str`]).
    pub file: String,
    /// The 1-based line of the offending field (or of its table).
    pub line: usize,
    /// The dotted path of the field, e.g. `policies.daily.window`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A file's text and name, to place errors at a line and a dotted field.
pub(crate) struct Source<'a> {
    pub(crate) file: &'a str,
    pub(crate) text: &'a str,
}

impl Source<'_> {
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1
    }

    /// The dotted path of the key at `offset`: the enclosing `[table]` plus the line's key.
    pub(crate) fn path_at(&self, offset: usize) -> String {
        let before = &self.text[..offset.min(self.text.len())];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = self.text[line_start..].lines().next().unwrap_or("");
        if line.trim_start().starts_with('[') {
            // A table header (perhaps a broken one): the table is the field.
            let name = line.trim().trim_matches(|c| c == '[' || c == ']').trim();
            return name.to_string();
        }
        let key = line
            .split_once('=')
            .map(|(k, _)| k.trim().trim_matches('"').to_string())
            .filter(|k| !k.starts_with('['));
        let table = before[..line_start]
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with('['))
            .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
        match (table, key) {
            (Some(table), Some(key)) => format!("{table}.{key}"),
            (Some(table), None) => table,
            (None, Some(key)) => key,
            (None, None) => String::new(),
        }
    }

    /// The line of `key = ...` in the table that starts at `span` (up to the next table
    /// header), or the table's first line.
    pub(crate) fn line_of_key(&self, span: std::ops::Range<usize>, key: &str) -> usize {
        let start = span.start.min(self.text.len());
        let mut offset = start;
        for (i, line) in self.text[start..].split_inclusive('\n').enumerate() {
            let trimmed = line.trim_start();
            if i > 0 && trimmed.starts_with('[') {
                break;
            }
            if let Some(rest) = trimmed.strip_prefix(key)
                && rest.trim_start().starts_with('=')
            {
                return self.line_of(offset);
            }
            offset += line.len();
        }
        self.line_of(start)
    }

    /// Deserialize the text; a TOML or shape error names its line and dotted field.
    pub(crate) fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(self.text).map_err(|e| {
            let offset = e.span().map_or(0, |span| span.start);
            let field = self.path_at(offset);
            self.error(
                self.line_of(offset),
                if field.is_empty() {
                    "(file)".to_string()
                } else {
                    field
                },
                e.message().trim().to_string(),
            )
        })
    }

    pub(crate) fn error(
        &self,
        line: usize,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line,
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Read a file the config names (a key, a certificate) of at most `max` bytes, or say which
/// file and why not.
pub(crate) fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > max {
        return Err(format!("{}: longer than {max} bytes", path.display()));
    }
    Ok(bytes)
}

/// Read a config file, or say which file could not be read and why.
pub(crate) fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: 1,
        field: "(file)".to_string(),
        reason: format!("cannot read the file: {e}"),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        // The text before the first bad byte is valid: it places the error.
        let before = String::from_utf8_lossy(&e.as_bytes()[..valid]).into_owned();
        let source = Source {
            file: &file,
            text: &before,
        };
        let field = source.path_at(valid);
        source.error(
            source.line_of(valid),
            if field.is_empty() {
                "(file)".to_string()
            } else {
                field
            },
            format!("the file is not UTF-8 text (byte {valid} is not); TOML files are UTF-8"),
        )
    })
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!("`{text}` is not a duration ({e}); write e.g. \"1s\", \"500ms\", \"1m\", \"1d\"")
    })
}
