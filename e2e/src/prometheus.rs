//! A real Prometheus server (Debian's `prometheus`) scraping ebb's binaries in a test, and the
//! chart's dashboard queries and alert expressions evaluated against what it scraped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{free_port, wait_for};

/// One scrape job: its `job` label, its `namespace` label (as the chart's ServiceMonitors set
/// it) and the `host:port` addresses of its targets.
#[derive(Clone, Debug)]
pub struct ScrapeJob {
    pub job: String,
    pub namespace: String,
    pub targets: Vec<String>,
}

/// A running Prometheus, stopped when dropped.
pub struct Prometheus {
    /// `127.0.0.1:<port>` of its HTTP API.
    pub addr: String,
    log: PathBuf,
    _child: tokio::process::Child,
}

impl Prometheus {
    /// Starts Prometheus with its storage under `dir`, scraping `jobs` every second, and waits
    /// until it is ready.
    pub async fn start(dir: &Path, jobs: &[ScrapeJob]) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join("data"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
        );
        for j in jobs {
            let targets: Vec<String> = j.targets.iter().map(|t| format!("\"{t}\"")).collect();
            config.push_str(&format!(
                "  - job_name: \"{}\"\n    static_configs:\n      - targets: [{}]\n        labels:\n          namespace: \"{}\"\n",
                j.job,
                targets.join(", "),
                j.namespace
            ));
        }
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).context("cannot write prometheus.yml")?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).context("cannot create Prometheus's log")?;
        let err = out.try_clone().context("cannot share Prometheus's log")?;
        let child = tokio::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .context(
                "cannot start prometheus (Debian: apt-get install prometheus; `make test` installs it)",
            )?;
        let p = Self {
            addr,
            log,
            _child: child,
        };
        let a = p.addr.clone();
        if let Err(e) = wait_for("Prometheus is ready", Duration::from_secs(60), || {
            let a = a.clone();
            async move {
                http(&a, "GET", "/-/ready", None)
                    .await
                    .ok()
                    .filter(|(s, _)| *s == 200)
            }
        })
        .await
        {
            bail!("{e}; its log:\n{}", p.log_text());
        }
        Ok(p)
    }

    /// The instant vector `expr` evaluates to now (`/api/v1/query`): its series, each with
    /// `metric` and `value`. An expression Prometheus refuses is an error naming why.
    pub async fn query(&self, expr: &str) -> anyhow::Result<Vec<Value>> {
        let body = format!("query={}", percent_encode(expr));
        let (status, text) = http(&self.addr, "POST", "/api/v1/query", Some(&body)).await?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("Prometheus answered {status} with no JSON: {text}"))?;
        if v["status"] != "success" {
            bail!("{}: {}", v["errorType"], v["error"]);
        }
        match &v["data"]["result"] {
            Value::Array(a) => Ok(a.clone()),
            // A scalar or a string: one value.
            other => Ok(vec![other.clone()]),
        }
    }

    /// The targets' health (`/api/v1/targets`): (job, address, health, last error).
    pub async fn targets(&self) -> anyhow::Result<Vec<(String, String, String, String)>> {
        let (_, text) = http(&self.addr, "GET", "/api/v1/targets", None).await?;
        let v: Value = serde_json::from_str(&text).context("Prometheus's targets are not JSON")?;
        Ok(v["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
                (
                    t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                    s("scrapeUrl"),
                    s("health"),
                    s("lastError"),
                )
            })
            .collect())
    }

    /// Prometheus's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Every panel query of a Grafana dashboard (`panels[].targets[].expr`, rows' panels too):
/// (panel title, expression), with the dashboard's variables given values a test can evaluate:
/// `$policy` any policy, `$__rate_interval` one minute.
pub fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((title.to_string(), expr.to_string()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out.into_iter()
        .map(|(t, e)| {
            let e = e
                .replace("$__rate_interval", "1m")
                .replace("$__range", "1h")
                .replace("\"$policy\"", "\".*\"")
                .replace("$policy", ".*");
            (t, e)
        })
        .collect()
}

/// `s` with every byte outside RFC 3986's unreserved set percent-encoded (a form value).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One plain HTTP/1.0 request; returns (status, body).
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    form: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\n");
    if let Some(body) = form {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        req.push_str("\r\n");
    }
    s.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{addr} answered no HTTP: {text}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{addr} answered no status: {head}"))?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_are_encoded_and_dashboard_variables_replaced() {
        assert_eq!(
            percent_encode("sum(x{a=~\".*\"}) [1m]"),
            "sum%28x%7Ba%3D~%22.%2A%22%7D%29%20%5B1m%5D"
        );
        let d = serde_json::json!({"panels": [
            {"title": "row", "panels": [{"title": "a", "targets": [{"expr": "rate(m{policy=~\"$policy\"}[$__rate_interval])"}]}]},
            {"title": "b", "targets": [{"expr": "up"}, {"refId": "no expr"}]}
        ]});
        assert_eq!(
            dashboard_queries(&d),
            vec![
                ("a".to_string(), "rate(m{policy=~\".*\"}[1m])".to_string()),
                ("b".to_string(), "up".to_string())
            ]
        );
    }
}
