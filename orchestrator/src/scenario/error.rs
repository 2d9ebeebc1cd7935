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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// A list of one problem.
    pub(super) fn one(at: Option<usize>, message: impl Into<String>) -> Self {
        Problems {
            list: vec![Problem {
                at,
                message: message.into(),
            }],
        }
    }

    /// Records a problem at byte offset `at`.
    pub(super) fn at(&mut self, at: usize, message: impl Into<String>) {
        self.list.push(Problem {
            at: Some(at),
            message: message.into(),
        });
    }

    /// Records a problem that has no place in the source.
    pub(super) fn nowhere(&mut self, message: impl Into<String>) {
        self.list.push(Problem {
            at: None,
            message: message.into(),
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Sorts the problems into source order and gives them lines and columns,
    /// in one pass over the source however many problems there are.
    pub(super) fn into_errors(mut self, source: &str, origin: &str) -> ScenarioErrors {
        // Stable: problems at the same offset keep the order they were found in.
        self.list.sort_by_key(|p| p.at);
        let mut cursor = Cursor::new(source);
        let errors = self
            .list
            .into_iter()
            .map(|p| {
                let (line, column) = p.at.map_or((0, 0), |at| cursor.locate(at));
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

/// Walks the source forward to turn increasing byte offsets into lines and
/// columns, so that many problems on one long line cost one walk of it.
struct Cursor<'a> {
    source: &'a str,
    /// The byte offset reached, with its 1-based line and 0-based column.
    at: usize,
    line: usize,
    column: usize,
}

impl<'a> Cursor<'a> {
    fn new(source: &'a str) -> Self {
        Cursor {
            source,
            at: 0,
            line: 1,
            column: 0,
        }
    }

    /// 1-based line and column (counted in characters) of byte offset `to`,
    /// which must not be smaller than the last one asked for. An offset
    /// inside a character counts as that character.
    fn locate(&mut self, to: usize) -> (usize, usize) {
        let to = to.min(self.source.len());
        if to > self.at {
            for (i, c) in self.source[self.at..].char_indices() {
                if self.at + i >= to {
                    break;
                }
                if c == '\n' {
                    self.line += 1;
                    self.column = 0;
                } else {
                    self.column += 1;
                }
            }
            // Land on a character boundary at or after `to`.
            self.at = (to..=self.source.len())
                .find(|&i| self.source.is_char_boundary(i))
                .unwrap_or(self.source.len());
        }
        (self.line, self.column + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_columns() {
        let source = "ab\ncd\n\né=x";
        let mut cursor = Cursor::new(source);
        assert_eq!(cursor.locate(0), (1, 1));
        assert_eq!(cursor.locate(0), (1, 1));
        assert_eq!(cursor.locate(1), (1, 2));
        assert_eq!(cursor.locate(3), (2, 1));
        assert_eq!(cursor.locate(6), (3, 1));
        // 'é' is two bytes but one column.
        assert_eq!(cursor.locate(9), (4, 2));
        assert_eq!(cursor.locate(1000), (4, 4));
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
