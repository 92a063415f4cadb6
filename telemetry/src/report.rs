//! How an error reaches the user of the command line: each cause once, outermost first, and a
//! Kubernetes API error as the server's message, reason and code rather than a debug dump.

use std::error::Error as StdError;

/// The lines to print for `err`: `error: <what failed>`, then `  caused by: <why>` per cause
/// that adds something the line above does not already say.
pub fn error_report(err: &anyhow::Error) -> String {
    let causes: Vec<&(dyn StdError + 'static)> = err.chain().collect();
    let mut lines = Vec::new();
    for (i, cause) in causes.iter().enumerate() {
        if let Some(status) = api_status(*cause) {
            lines.push(format!(
                "{} ({}, HTTP {})",
                status.message, status.reason, status.code
            ));
            break;
        }
        let mut text = cause.to_string();
        // Error types that print their source inside their own message: keep only what is theirs.
        for inner in &causes[i + 1..] {
            text = text.replace(&inner.to_string(), "");
        }
        let text = tidy(&text);
        if !text.is_empty() && !is_bare_kind(&text) {
            lines.push(text);
        }
    }
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let prefix = if i == 0 { "error: " } else { "  caused by: " };
        out.push_str(prefix);
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The API server's answer inside a kube error, if that is what `cause` is.
fn api_status<'a>(cause: &'a (dyn StdError + 'static)) -> Option<&'a kube::core::Status> {
    match cause.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(status)) => Some(status),
        _ => cause.downcast_ref::<kube::core::Status>(),
    }
}

/// Drops the separators a removed source leaves behind (`"x: "`, `"x ()"`, doubled spaces).
fn tidy(text: &str) -> String {
    let mut t = text
        .replace(" ()", "")
        .replace(":  (", " (")
        .replace(": (", " (");
    while t.contains("  ") {
        t = t.replace("  ", " ");
    }
    t.trim().trim_end_matches(':').trim().to_string()
}

/// A wrapper's leftover that only names an error kind (`Kube error`), saying nothing new.
fn is_bare_kind(text: &str) -> bool {
    text.to_ascii_lowercase().ends_with("error") && text.split_whitespace().count() <= 3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_found() -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("namespaces \"ebb-system\" not found", "NotFound")
                .with_code(404),
        ))
    }

    #[derive(Debug, thiserror::Error)]
    #[error("Kube error: {0}")]
    struct Wrapper(#[source] kube::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot use Lease ebb-system/ebb-controller: {source} (check the namespace)")]
    struct Outer {
        #[source]
        source: Wrapper,
    }

    #[test]
    fn each_cause_is_printed_once_and_the_api_answer_plainly() {
        let err = anyhow::Error::new(Outer {
            source: Wrapper(not_found()),
        });
        let report = error_report(&err);
        assert_eq!(
            report,
            "error: cannot use Lease ebb-system/ebb-controller (check the namespace)\n  \
             caused by: namespaces \"ebb-system\" not found (NotFound, HTTP 404)\n",
        );
    }

    #[test]
    fn context_layers_stay_in_order() {
        let err = anyhow::Error::new(std::io::Error::other("disk full"))
            .context("writing crds/a.yaml")
            .context("exporting the CRDs");
        assert_eq!(
            error_report(&err),
            "error: exporting the CRDs\n  caused by: writing crds/a.yaml\n  caused by: disk full\n"
        );
    }
}
