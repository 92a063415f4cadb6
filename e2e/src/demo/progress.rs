//! The live view of a running demo: a progress line of candidates / draining / removed read from
//! the policy status, and ebb's Events printed as they arrive, until the policy settles.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::bail;
use ebb_api::{ScaleDownPolicy, ScaleDownPolicyStatus};
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use kube::api::Api;
use kube::runtime::watcher;

/// The counts the progress line shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub candidates: i32,
    pub draining: i32,
    pub removed: i64,
}

impl Counts {
    fn of(s: &ScaleDownPolicyStatus) -> Self {
        Self {
            candidates: s.candidates,
            draining: s.draining,
            removed: s.removed_total,
        }
    }
}

/// Writes to the terminal: on a TTY the progress line is redrawn in place and Events scroll
/// above it; otherwise every change is a line of its own.
pub struct Display {
    tty: bool,
    start: Instant,
    nodes: usize,
    bar_shown: bool,
}

/// Bar width: the whole progress line fits in 80 columns (a wrapped line cannot be redrawn).
const BAR: usize = 18;

impl Display {
    pub fn new(nodes: usize) -> Self {
        Self {
            tty: std::io::stdout().is_terminal(),
            start: Instant::now(),
            nodes,
            bar_shown: false,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn stamp(&self) -> String {
        format!("[{:>5.1}s]", self.start.elapsed().as_secs_f64())
    }

    /// A bar of the pool: `#` removed, `=` draining, `-` candidate, `.` staying.
    fn bar(&self, c: Counts) -> String {
        let n = self.nodes.max(1);
        let scale = |k: i64| ((k.max(0) as usize).min(n) * BAR).div_ceil(n);
        let removed = scale(c.removed);
        let draining = scale(c.removed + i64::from(c.draining)).saturating_sub(removed);
        let candidates = scale(c.removed + i64::from(c.draining) + i64::from(c.candidates))
            .saturating_sub(removed + draining);
        let rest = BAR.saturating_sub(removed + draining + candidates);
        format!(
            "[{}{}{}{}]",
            "#".repeat(removed),
            "=".repeat(draining),
            "-".repeat(candidates),
            ".".repeat(rest)
        )
    }

    fn progress_text(&self, c: Counts) -> String {
        format!(
            "{} {} removed {:>3} draining {:>3} candidates {:>3} left {:>3}",
            self.stamp(),
            self.bar(c),
            c.removed,
            c.draining,
            c.candidates,
            (self.nodes as i64 - c.removed).max(0)
        )
    }

    /// Shows the counts (redrawn in place on a TTY, a new line otherwise).
    pub fn progress(&mut self, c: Counts) {
        let mut out = std::io::stdout().lock();
        if self.tty {
            let _ = write!(out, "\r\x1b[2K{}", self.progress_text(c));
            self.bar_shown = true;
        } else {
            let _ = writeln!(out, "{}", self.progress_text(c));
        }
        let _ = out.flush();
    }

    /// Prints a line above the progress line.
    pub fn line(&mut self, text: &str, redraw: Option<Counts>) {
        let mut out = std::io::stdout().lock();
        if self.tty && self.bar_shown {
            let _ = write!(out, "\r\x1b[2K");
        }
        let _ = writeln!(out, "{} {text}", self.stamp());
        drop(out);
        if self.tty
            && let Some(c) = redraw
        {
            self.progress(c);
        }
    }

    /// Ends the progress line so the next output starts on a fresh line.
    pub fn finish(&mut self) {
        if self.tty && self.bar_shown {
            println!();
            self.bar_shown = false;
        }
    }
}

/// An Event worth showing: ebb's Events on the policy, and on nodes all but the per-node
/// `ScaleDownCandidate` (the policy's summary of those is shown).
fn event_line(e: &Event) -> Option<String> {
    let reg = e.regarding.as_ref()?;
    let kind = reg.kind.as_deref().unwrap_or_default();
    let warning = e.type_.as_deref() == Some("Warning");
    let ours = e
        .reporting_controller
        .as_deref()
        .is_some_and(|c| c.starts_with("ebb"));
    let shown = match kind {
        "ScaleDownPolicy" => true,
        "Node" => e.reason.as_deref() != Some("ScaleDownCandidate"),
        _ => false,
    };
    if !ours || !shown {
        return None;
    }
    let object = if kind == "ScaleDownPolicy" {
        String::new()
    } else {
        format!(
            "{}/{}: ",
            kind.to_lowercase(),
            reg.name.as_deref().unwrap_or_default()
        )
    };
    Some(format!(
        "{:<7} {:<18} {object}{}",
        if warning { "Warning" } else { "Normal" },
        e.reason.as_deref().unwrap_or_default(),
        e.note.as_deref().unwrap_or_default()
    ))
}

/// How the view decides the demo is over.
pub struct Until {
    /// The counts must stay unchanged, with nothing draining, this long.
    pub settle: Duration,
    /// Give up after this long.
    pub timeout: Duration,
}

/// Shows progress and Events until the policy settles; returns its last status.
pub async fn follow(
    client: &kube::Client,
    policy: &str,
    display: &mut Display,
    until: Until,
) -> anyhow::Result<ScaleDownPolicyStatus> {
    let policies: Api<ScaleDownPolicy> = Api::all(client.clone());
    let events: Api<Event> = Api::all(client.clone());
    let mut stream = std::pin::pin!(watcher(events, watcher::Config::default()));
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let deadline = tokio::time::Instant::now() + until.timeout;
    let mut shown: Option<Counts> = None;
    let mut stable_since = tokio::time::Instant::now();
    let mut last = ScaleDownPolicyStatus::default();
    let mut seen = std::collections::HashSet::new();
    loop {
        tokio::select! {
            ev = stream.next() => {
                let Some(ev) = ev else { bail!("the Event watch ended") };
                // A watch error is retried by the watcher; the progress line goes on. An Event
                // is shown once: a repeat only bumps its series count.
                if let Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)) = ev
                    && let Some(uid) = e.metadata.uid.clone()
                    && seen.insert(uid)
                    && let Some(text) = event_line(&e)
                {
                    display.line(&text, shown);
                }
            }
            _ = tick.tick() => {
                let now = tokio::time::Instant::now();
                let status = policies.get_opt(policy).await?.and_then(|p| p.status);
                if let Some(status) = status.filter(|s| s.observed_generation.is_some()) {
                    let c = Counts::of(&status);
                    if shown != Some(c) {
                        display.progress(c);
                        shown = Some(c);
                        stable_since = now;
                    }
                    last = status;
                    if c.draining == 0 && now.duration_since(stable_since) >= until.settle {
                        display.finish();
                        return Ok(last);
                    }
                }
                if now >= deadline {
                    display.finish();
                    bail!(
                        "the policy did not settle within {:?} (last status: {} candidates, {} draining, {} removed)",
                        until.timeout, last.candidates, last.draining, last.removed_total
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_splits_the_pool() {
        let d = Display {
            tty: false,
            start: Instant::now(),
            nodes: 2 * BAR,
            bar_shown: false,
        };
        let c = Counts {
            candidates: 4,
            draining: 8,
            removed: BAR as i64,
        };
        // Half the pool removed, then 8 and 4 nodes at two nodes per column (rounded up).
        assert_eq!(
            d.bar(c),
            format!(
                "[{}{}{}{}]",
                "#".repeat(BAR / 2),
                "=".repeat(4),
                "-".repeat(2),
                ".".repeat(BAR / 2 - 6)
            )
        );
        assert!(
            d.progress_text(Counts {
                candidates: 100,
                draining: 100,
                removed: 999
            })
            .len()
                < 80
        );
    }
}
