//! An error told with its causes, as the command line and the launchers'
//! readiness probes show it.

/// `error` and each of its sources, joined with ": ", skipping a source
/// whose text the line already holds (an error that quotes its cause).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{what}")]
    struct Layer {
        what: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layer(what: &'static str, source: Option<Layer>) -> Layer {
        Layer {
            what,
            source: source.map(Box::new),
        }
    }

    #[test]
    fn causes_follow_the_error_once_each() {
        let refused = layer("connection refused", None);
        let connect = layer("connect 127.0.0.1:1", Some(refused));
        assert_eq!(
            error_chain(&layer("hop \"b\"", Some(connect))),
            "hop \"b\": connect 127.0.0.1:1: connection refused"
        );
        // A cause the message already quotes is not repeated.
        let refused = layer("connection refused", None);
        assert_eq!(
            error_chain(&layer("connect: connection refused", Some(refused))),
            "connect: connection refused"
        );
    }
}
