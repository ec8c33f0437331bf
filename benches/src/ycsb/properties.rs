//! YCSB property files (`-P workloads/workloada`, `-p key=value`).
//!
//! The subset of `java.util.Properties` that YCSB workload files use:
//!
//! - one `key=value` (or `key:value`) per line, whitespace around key and
//!   value ignored;
//! - lines starting with `#` or `!` are comments, blank lines are skipped;
//! - a line ending in an odd number of backslashes continues on the next line;
//! - a later definition of a key replaces an earlier one.
//!
//! Stricter than Java, on purpose: a line with neither `=` nor `:` (Java would
//! read `key value` or a key with an empty value) is a syntax error, since in a
//! workload file it is almost always a typo. Backslash escapes other than the
//! line continuation (`\n`, `\uXXXX`) are kept literally; workload files do
//! not use them.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::{Result, YcsbError};

/// An ordered set of YCSB properties (`key -> value`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    map: BTreeMap<String, String>,
}

impl Properties {
    /// No properties.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the text of a property file.
    ///
    /// # Errors
    /// [`YcsbError::Syntax`] for a line that is not `key=value` or has an
    /// empty key.
    pub fn parse(text: &str) -> Result<Self> {
        let mut props = Self::new();
        let mut lines = text.lines().enumerate();
        while let Some((index, raw)) = lines.next() {
            let first = index + 1;
            let mut logical = raw.trim_start().to_owned();
            if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
                continue;
            }
            // Join continuation lines (odd number of trailing backslashes).
            while ends_with_continuation(&logical) {
                logical.pop();
                match lines.next() {
                    Some((_, next)) => logical.push_str(next.trim_start()),
                    None => break,
                }
            }
            let Some(sep) = logical.find(['=', ':']) else {
                return Err(YcsbError::Syntax {
                    line: first,
                    reason: "expected key=value",
                    text: raw.to_owned(),
                });
            };
            let key = logical[..sep].trim();
            if key.is_empty() {
                return Err(YcsbError::Syntax {
                    line: first,
                    reason: "empty key",
                    text: raw.to_owned(),
                });
            }
            let value = logical[sep + 1..].trim();
            props.set(key, value);
        }
        Ok(props)
    }

    /// Reads and parses a property file.
    ///
    /// # Errors
    /// [`YcsbError::ReadFile`] if the file cannot be read (or is not UTF-8),
    /// otherwise as [`Properties::parse`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| YcsbError::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses one `key=value` assignment, as given to YCSB's `-p`.
    ///
    /// # Errors
    /// [`YcsbError::Syntax`] (line 1) if it is not `key=value`.
    pub fn set_assignment(&mut self, assignment: &str) -> Result<()> {
        let parsed = Self::parse(assignment)?;
        if parsed.map.is_empty() {
            return Err(YcsbError::Syntax {
                line: 1,
                reason: "expected key=value",
                text: assignment.to_owned(),
            });
        }
        self.extend(&parsed);
        Ok(())
    }

    /// Sets `key` to `value`, replacing any previous value.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.map.insert(key.into(), value.into());
    }

    /// Copies every property of `other` into `self` (`other` wins), like a
    /// later `-P` file or `-p` on YCSB's command line.
    pub fn extend(&mut self, other: &Properties) {
        for (k, v) in &other.map {
            self.map.insert(k.clone(), v.clone());
        }
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// All properties in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of properties.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are no properties.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

fn ends_with_continuation(line: &str) -> bool {
    line.bytes().rev().take_while(|&b| b == b'\\').count() % 2 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_workload_file_syntax() {
        let text = "# Yahoo! Cloud System Benchmark\n\
                    ! also a comment\n\
                    \n\
                    recordcount=1000\n\
                    \toperationcount = 2000 \r\n\
                    workload=site.ycsb.workloads.CoreWorkload\n\
                    readproportion:0.5\n\
                    requestdistribution=zip\\\n\
                    \x20   fian\n\
                    table=\n\
                    recordcount=3000\n";
        let p = Properties::parse(text).unwrap();
        assert_eq!(p.get("recordcount"), Some("3000"), "last definition wins");
        assert_eq!(p.get("operationcount"), Some("2000"));
        assert_eq!(p.get("readproportion"), Some("0.5"));
        assert_eq!(p.get("requestdistribution"), Some("zipfian"));
        assert_eq!(p.get("table"), Some(""));
        assert_eq!(p.get("workload"), Some("site.ycsb.workloads.CoreWorkload"));
        assert_eq!(p.get("missing"), None);
        assert_eq!(p.len(), 6);
    }

    #[test]
    fn value_may_contain_separators() {
        let p = Properties::parse("url=http://host:80/a=b").unwrap();
        assert_eq!(p.get("url"), Some("http://host:80/a=b"));
        // An even number of trailing backslashes is not a continuation.
        let p = Properties::parse("path=C:\\\\\nnext=1").unwrap();
        assert_eq!(p.get("path"), Some("C:\\\\"));
        assert_eq!(p.get("next"), Some("1"));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let err = Properties::parse("a=1\n\nrecordcount 1000\n").unwrap_err();
        match err {
            YcsbError::Syntax { line, text, .. } => {
                assert_eq!(line, 3);
                assert_eq!(text, "recordcount 1000");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            Properties::parse("=5"),
            Err(YcsbError::Syntax { line: 1, .. })
        ));
    }

    #[test]
    fn assignments_and_overrides() {
        let mut p = Properties::parse("recordcount=10\nreadproportion=1").unwrap();
        p.set_assignment("recordcount=20").unwrap();
        assert_eq!(p.get("recordcount"), Some("20"));
        assert!(p.set_assignment("nonsense").is_err());
        assert!(p.set_assignment("# comment").is_err());
        let keys: Vec<_> = p.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["readproportion", "recordcount"]);
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = Properties::from_file("/nonexistent/ycsb/workloadz").unwrap_err();
        assert!(matches!(err, YcsbError::ReadFile { .. }));
        assert!(err.to_string().contains("/nonexistent/ycsb/workloadz"));
    }
}
