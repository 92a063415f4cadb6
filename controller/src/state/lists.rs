//! How the caches take their first list: one streamed watch (`sendInitialEvents`, Kubernetes
//! 1.34+ by default) or paged LIST calls, chosen from the API server's version unless set.

use kube::runtime::watcher;

/// How a cache lists its kind at start and after a watch expires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum InitialList {
    /// Stream when the API server is Kubernetes 1.34 or newer (WatchList on by default), else
    /// list.
    #[default]
    Auto,
    /// A watch that sends the current objects first: the API server never builds a whole list
    /// response and the controller never holds one.
    Stream,
    /// Paged LIST calls (500 objects a page), then a watch.
    List,
}

impl InitialList {
    /// `Auto` resolved against the API server's version (`List` when it cannot be read).
    pub async fn resolve(self, client: &kube::Client) -> Self {
        if self != InitialList::Auto {
            return self;
        }
        match client.apiserver_version().await {
            Ok(v) if streams(&v.major, &v.minor) => InitialList::Stream,
            Ok(v) => {
                tracing::info!(major = %v.major, minor = %v.minor, "the API server predates streamed lists by default; listing");
                InitialList::List
            }
            Err(e) => {
                tracing::warn!(error = %e, "the API server's version is unknown; listing");
                InitialList::List
            }
        }
    }

    /// The watcher configuration of a cache (any resourceVersion: served from the watch cache).
    pub fn config(self) -> watcher::Config {
        let c = watcher::Config::default().any_semantic();
        match self {
            InitialList::Stream => c.streaming_lists(),
            InitialList::Auto | InitialList::List => c,
        }
    }
}

/// Kubernetes 1.34 or newer (`minor` may carry a `+`, as on some distributions).
fn streams(major: &str, minor: &str) -> bool {
    let minor: u32 = minor
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or(0);
    major == "1" && minor >= 34 || major.parse::<u32>().is_ok_and(|m| m > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_from_1_34() {
        assert!(streams("1", "34"));
        assert!(streams("1", "36+"));
        assert!(!streams("1", "33"));
        assert!(!streams("1", "garbage"));
        assert!(streams("2", "0"));
    }
}
