//! Problems found in a scenario file. Inside the parser a problem is a
//! message and a byte offset; at the public boundary it becomes a
//! [`ScenarioError`] with a 1-based line and column.

use std::fmt;

/// One problem in a scenario file.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioError {
    /// Where the scenario came from (a file path), as given to `parse`.
    pub origin: String,
    /// 1-based line of the problem; 0 when unknown.
    pub line: usize,
    /// 1-based column (in characters) of the problem; 0 when unknown.
    pub column: usize,
    /// What is wrong, in plain words.
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.origin, self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for ScenarioError {}

/// Every problem found in a scenario file, in source order.
#[derive(Debug, thiserror::Error)]
#[error("{}", join_lines(.errors))]
pub struct ScenarioErrors {
    /// The problems, in source order (problems without a location first).
    pub errors: Vec<ScenarioError>,
}

fn join_lines(errors: &[ScenarioError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A problem before it is given a line and column: `at` is a byte offset
/// into the source, `None` when the problem has no place in it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Problem {
    pub at: Option<usize>,
    pub message: String,
}

/// The problems collected while reading a scenario.
#[derive(Debug, Default)]
pub(super) struct Problems {
    pub list: Vec<Problem>,
}

impl Problems {
    /// Records a problem at byte offset `at`.
    pub fn at(&mut self, at: usize, message: impl Into<String>) {
        self.list.push(Problem {
            at: Some(at),
            message: message.into(),
        });
    }

    /// Records a problem that has no place in the source.
    pub fn nowhere(&mut self, message: impl Into<String>) {
        self.list.push(Problem {
            at: None,
            message: message.into(),
        });
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Sorts the problems into source order and gives them lines and columns.
    pub fn into_errors(mut self, source: &str, origin: &str) -> ScenarioErrors {
        // Stable: problems at the same offset keep the order they were found in.
        self.list.sort_by_key(|p| p.at);
        let lines = LineIndex::new(source);
        let errors = self
            .list
            .into_iter()
            .map(|p| {
                let (line, column) = p.at.map_or((0, 0), |at| lines.locate(source, at));
                ScenarioError {
                    origin: origin.to_owned(),
                    line,
                    column,
                    message: p.message,
                }
            })
            .collect();
        ScenarioErrors { errors }
    }
}

/// Byte offsets of line starts, to turn an offset into a line and column.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(source: &str) -> Self {
        let starts = std::iter::once(0)
            .chain(source.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { starts }
    }

    /// 1-based line and column (counted in characters) of byte offset `at`.
    fn locate(&self, source: &str, at: usize) -> (usize, usize) {
        let at = at.min(source.len());
        let line = self.starts.partition_point(|&s| s <= at).max(1);
        let start = self.starts.get(line - 1).copied().unwrap_or(0);
        let column = source
            .get(start..at)
            .map_or(at - start, |prefix| prefix.chars().count());
        (line, column + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_columns() {
        let source = "ab\ncd\n\né=x";
        let lines = LineIndex::new(source);
        assert_eq!(lines.locate(source, 0), (1, 1));
        assert_eq!(lines.locate(source, 1), (1, 2));
        assert_eq!(lines.locate(source, 3), (2, 1));
        assert_eq!(lines.locate(source, 6), (3, 1));
        // 'é' is two bytes but one column.
        assert_eq!(lines.locate(source, 9), (4, 2));
        assert_eq!(lines.locate(source, 1000), (4, 4));
    }

    #[test]
    fn display_is_one_problem_per_line() {
        let mut problems = Problems::default();
        problems.at(3, "second");
        problems.nowhere("first");
        problems.at(0, "also second");
        let errors = problems.into_errors("ab\ncd", "s.toml");
        assert_eq!(
            errors.to_string(),
            "s.toml: first\ns.toml:1:1: also second\ns.toml:2:1: second"
        );
    }
}
