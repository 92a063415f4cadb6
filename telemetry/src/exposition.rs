//! The two exposition formats of `/metrics`: OpenMetrics (what prometheus-client writes, with
//! exemplars) for scrapers that ask for it, the classic Prometheus text format for the rest.

/// OpenMetrics' content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format's content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// True when an `Accept` header asks for OpenMetrics (Prometheus does; `curl` does not).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// OpenMetrics text as the classic Prometheus text format: no `# EOF`, `# UNIT` or exemplars,
/// and a counter's `# HELP`/`# TYPE` name carrying the `_total` of its samples.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            if let (Some(name), Some("counter")) = (w.next(), w.next()) {
                out.push_str(&format!("# TYPE {name}_total counter\n"));
                continue;
            }
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            if is_counter(openmetrics, name) {
                out.push_str(&format!("# HELP {name}_total {help}\n"));
                continue;
            }
        }
        if line.starts_with('#') {
            out.push_str(line);
        } else {
            // `name{labels} value # {exemplar} value`: keep the sample only. Label values are
            // quoted; " # " cannot start inside a sample before the exemplar.
            out.push_str(strip_exemplar(line));
        }
        out.push('\n');
    }
    out
}

fn is_counter(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        l.strip_prefix("# TYPE ")
            .and_then(|r| r.strip_prefix(name))
            .is_some_and(|r| r.trim() == "counter")
    })
}

/// The sample without its exemplar (outside quoted label values).
fn strip_exemplar(line: &str) -> &str {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '#' if !quoted && line[..i].ends_with(' ') => return line[..i].trim_end(),
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP ebb_evictions Eviction API calls, by result\n\
# TYPE ebb_evictions counter\n\
ebb_evictions_total{policy=\"a # b\",result=\"evicted\"} 3\n\
# HELP ebb_drain_duration_seconds Duration of node drains\n\
# TYPE ebb_drain_duration_seconds histogram\n\
# UNIT ebb_drain_duration_seconds seconds\n\
ebb_drain_duration_seconds_bucket{le=\"1.0\"} 1 # {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.5\n\
# EOF\n";

    #[test]
    fn openmetrics_becomes_prometheus_text() {
        let text = to_prometheus_text(OM);
        assert_eq!(
            text,
            "# HELP ebb_evictions_total Eviction API calls, by result\n\
# TYPE ebb_evictions_total counter\n\
ebb_evictions_total{policy=\"a # b\",result=\"evicted\"} 3\n\
# HELP ebb_drain_duration_seconds Duration of node drains\n\
# TYPE ebb_drain_duration_seconds histogram\n\
ebb_drain_duration_seconds_bucket{le=\"1.0\"} 1\n"
        );
    }

    #[test]
    fn only_an_openmetrics_accept_header_gets_openmetrics() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }
}
