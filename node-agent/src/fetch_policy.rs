//! Which sources the localizer may read: `file://` only under operator-listed roots (canonical,
//! no symlinks); `http(s)://` only to addresses allowed after DNS resolution and on every redirect.
//!
//! Addresses: link-local (cloud metadata), unspecified, multicast, broadcast, reserved and the
//! node's own addresses are always refused. Loopback, private (RFC 1918, CGNAT, IPv6 ULA) and the
//! cluster's ranges are refused unless an operator lists the host or a CIDR holding the address.
//! IPv4-mapped, IPv4-compatible, NAT64 and 6to4 IPv6 addresses are judged by the IPv4 inside.
//! Names are resolved once by [`PolicyResolver`]; the HTTP client connects only to the addresses
//! it returned, all of which were checked, so an answer that changes later cannot slip through.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use ipnet::IpNet;

/// Redirects followed at most.
pub const MAX_REDIRECTS: usize = 5;

/// Directories no `--file-root` may contain or lie in: the agent's credentials and the host's.
const PROTECTED: [&str; 8] = [
    "/var/run/secrets",
    "/run/secrets",
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/root",
    "/var/lib/kubelet",
];

/// What an address is, as far as fetching goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressClass {
    Public,
    Loopback,
    Private,
    Cluster,
    LinkLocal,
    Unspecified,
    Multicast,
    Broadcast,
    Reserved,
    NodeOwn,
}

impl AddressClass {
    /// Refused whatever the operator allows.
    pub fn always_refused(self) -> bool {
        matches!(
            self,
            AddressClass::LinkLocal
                | AddressClass::Unspecified
                | AddressClass::Multicast
                | AddressClass::Broadcast
                | AddressClass::Reserved
                | AddressClass::NodeOwn
        )
    }
}

impl std::fmt::Display for AddressClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddressClass::Public => "a public address",
            AddressClass::Loopback => "a loopback address",
            AddressClass::Private => "a private address",
            AddressClass::Cluster => "an address of the cluster's ranges",
            AddressClass::LinkLocal => "a link-local address (such as a cloud metadata service)",
            AddressClass::Unspecified => "an unspecified address",
            AddressClass::Multicast => "a multicast address",
            AddressClass::Broadcast => "a broadcast address",
            AddressClass::Reserved => "a reserved address",
            AddressClass::NodeOwn => "one of the node's own addresses",
        })
    }
}

/// Why a source was refused. The text reaches the tenant (NodeState), so it says what rule
/// refused the source and never what the agent found behind it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("file:// URLs are not enabled on this node (the operator lists none with --file-root)")]
    NoFileRoots,
    #[error("file:// path is not under a directory the operator allows (--file-root)")]
    OutsideRoots,
    #[error(
        "file:// URL must be file:///<absolute path>, without a host, `.` or `..` segments or empty segments"
    )]
    NotPlainPath,
    #[error("file:// path goes through a symbolic link, which the agent does not follow")]
    Symlink,
    #[error("file:// path is not a regular file")]
    NotRegular,
    #[error("host {host} is {class}, which the agent does not fetch from{hint}")]
    Address {
        host: String,
        class: AddressClass,
        hint: &'static str,
    },
    #[error("host {host} resolves to no address")]
    NoAddress { host: String },
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    #[error("redirect from https to http refused")]
    Downgrade,
    #[error("unsupported URL scheme {0:?} (use http, https or file)")]
    Scheme(String),
    #[error("URL has no host")]
    NoHost,
}

/// The operator's settings, as the command line gives them.
#[derive(Clone, Debug, Default)]
pub struct PolicyConfig {
    pub file_roots: Vec<PathBuf>,
    /// Host names (`artifacts.example.com`, `*.example.com`) allowed even at private, loopback
    /// or cluster addresses.
    pub allow_hosts: Vec<String>,
    /// Address ranges allowed even when private, loopback or the cluster's.
    pub allow_cidrs: Vec<IpNet>,
    /// The cluster's pod and service ranges.
    pub cluster_cidrs: Vec<IpNet>,
    /// The agent's own directories (state, cache, socket): no file root may overlap them.
    pub own_dirs: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyConfigError {
    #[error("--file-root {path}: {source}; list existing directories of artifacts")]
    Root { path: PathBuf, source: io::Error },
    #[error("--file-root {path}: not a directory")]
    RootNotDir { path: PathBuf },
    #[error(
        "--file-root {path} overlaps {protected}, which holds the agent's state or secrets; list only directories of artifacts"
    )]
    RootOverlaps { path: PathBuf, protected: PathBuf },
    #[error(
        "--fetch-allow-host {host:?}: write a host name such as artifacts.example.com or *.example.com"
    )]
    BadHost { host: String },
}

/// Reading a `file://` source failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("cannot read it: {0}")]
    Io(io::Error),
}

/// The policy one agent applies to every source.
#[derive(Debug, Default)]
pub struct FetchPolicy {
    file_roots: Vec<PathBuf>,
    allow_hosts: Vec<String>,
    allow_cidrs: Vec<IpNet>,
    cluster_cidrs: Vec<IpNet>,
    node_addresses: RwLock<Vec<IpAddr>>,
}

/// The IPv4 address an IPv6 one carries (mapped, compatible, NAT64, 6to4), if any.
fn embedded_v4(v6: &Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // IPv4-compatible (deprecated) ::a.b.c.d, but not :: or ::1
    if s[..6].iter().all(|x| *x == 0) && (s[6] != 0 || s[7] > 1) {
        return Some(tail);
    }
    // NAT64 well-known prefix 64:ff9b::/96
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|x| *x == 0) {
        return Some(tail);
    }
    // 6to4 2002:AABB:CCDD::/48
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

fn net(s: &str) -> IpNet {
    // Constant, well-formed ranges.
    s.parse().unwrap_or_else(|_| IpNet::V4(Default::default()))
}

fn builtin_v4(ip: Ipv4Addr) -> AddressClass {
    let o = ip.octets();
    let within = |cidr: &str| net(cidr).contains(&IpAddr::V4(ip));
    if o[0] == 0 {
        AddressClass::Unspecified
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_link_local() {
        AddressClass::LinkLocal
    } else if ip.is_broadcast() {
        AddressClass::Broadcast
    } else if ip.is_multicast() {
        AddressClass::Multicast
    } else if o[0] >= 240 {
        AddressClass::Reserved
    } else if ip.is_private() || within("100.64.0.0/10") || within("198.18.0.0/15") {
        AddressClass::Private
    } else if within("192.0.0.0/24") {
        AddressClass::Reserved
    } else {
        AddressClass::Public
    }
}

fn builtin_v6(ip: Ipv6Addr) -> AddressClass {
    let first = ip.segments()[0];
    if let Some(v4) = embedded_v4(&ip) {
        let c = builtin_v4(v4);
        if c != AddressClass::Public {
            return c;
        }
    }
    if ip.is_unspecified() {
        AddressClass::Unspecified
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_multicast() {
        AddressClass::Multicast
    } else if first & 0xffc0 == 0xfe80 {
        AddressClass::LinkLocal
    } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfec0 {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

/// The address itself and, for IPv6, the IPv4 address inside it.
fn forms(ip: IpAddr) -> Vec<IpAddr> {
    match ip {
        IpAddr::V4(_) => vec![ip],
        IpAddr::V6(v6) => {
            let mut v = vec![ip];
            if let Some(v4) = embedded_v4(&v6) {
                v.push(IpAddr::V4(v4));
            }
            v
        }
    }
}

fn host_pattern_ok(h: &str) -> bool {
    let name = h.strip_prefix("*.").unwrap_or(h);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn normalize_host(h: &str) -> String {
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// Resolves `path` if it exists (the protected directory may be a symlink, /var/run → /run).
fn resolved(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

impl FetchPolicy {
    /// Checks and canonicalises the configuration.
    pub fn new(cfg: PolicyConfig) -> Result<FetchPolicy, PolicyConfigError> {
        let mut protected: Vec<PathBuf> = PROTECTED.iter().map(PathBuf::from).collect();
        protected.extend(cfg.own_dirs.iter().cloned());
        let protected: Vec<(PathBuf, PathBuf)> =
            protected.into_iter().map(|p| (resolved(&p), p)).collect();
        let mut file_roots = Vec::new();
        for path in cfg.file_roots {
            let root = path
                .canonicalize()
                .map_err(|source| PolicyConfigError::Root {
                    path: path.clone(),
                    source,
                })?;
            if !root.is_dir() {
                return Err(PolicyConfigError::RootNotDir { path });
            }
            if let Some((_, p)) = protected
                .iter()
                .find(|(r, p)| root.starts_with(r) || r.starts_with(&root) || root.starts_with(p))
            {
                return Err(PolicyConfigError::RootOverlaps {
                    path,
                    protected: p.clone(),
                });
            }
            file_roots.push(root);
        }
        let mut allow_hosts = Vec::new();
        for h in cfg.allow_hosts {
            let n = normalize_host(&h);
            if !host_pattern_ok(&n) {
                return Err(PolicyConfigError::BadHost { host: h });
            }
            allow_hosts.push(n);
        }
        Ok(FetchPolicy {
            file_roots,
            allow_hosts,
            allow_cidrs: cfg.allow_cidrs,
            cluster_cidrs: cfg.cluster_cidrs,
            node_addresses: RwLock::new(Vec::new()),
        })
    }

    /// The node's own addresses (from its Node object), refused from now on.
    pub fn set_node_addresses(&self, addrs: Vec<IpAddr>) {
        *self
            .node_addresses
            .write()
            .unwrap_or_else(|p| p.into_inner()) = addrs;
    }

    pub fn file_roots(&self) -> &[PathBuf] {
        &self.file_roots
    }

    /// What `ip` is, before any allow-list.
    pub fn classify(&self, ip: IpAddr) -> AddressClass {
        let all = forms(ip);
        let own = self
            .node_addresses
            .read()
            .unwrap_or_else(|p| p.into_inner());
        if own
            .iter()
            .any(|n| forms(*n).iter().any(|f| all.contains(f)))
        {
            return AddressClass::NodeOwn;
        }
        let c = match ip {
            IpAddr::V4(v4) => builtin_v4(v4),
            IpAddr::V6(v6) => builtin_v6(v6),
        };
        if c == AddressClass::Public
            && self
                .cluster_cidrs
                .iter()
                .any(|n| all.iter().any(|a| n.contains(a)))
        {
            return AddressClass::Cluster;
        }
        c
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.allow_hosts.iter().any(|p| match p.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => *p == host,
        })
    }

    /// May the agent connect to `ip` for `host`?
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), Refusal> {
        let class = self.classify(ip);
        let refused = |hint| Refusal::Address {
            host: host.to_string(),
            class,
            hint,
        };
        if class.always_refused() {
            return Err(refused(""));
        }
        if class == AddressClass::Public || self.host_allowed(host) {
            return Ok(());
        }
        let forms = forms(ip);
        if self
            .allow_cidrs
            .iter()
            .any(|n| forms.iter().any(|a| n.contains(a)))
        {
            return Ok(());
        }
        Err(refused(
            " unless the operator allows it (--fetch-allow-host or --fetch-allow-cidr)",
        ))
    }

    /// Checks an `http(s)` URL before a request (and each redirect): the scheme, and the host
    /// when it is an address. Names are checked when they are resolved ([`PolicyResolver`]).
    pub fn check_url(&self, url: &url::Url) -> Result<(), Refusal> {
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(Refusal::Scheme(other.to_string())),
        }
        match url.host() {
            Some(url::Host::Ipv4(a)) => self.check_ip(&a.to_string(), IpAddr::V4(a)),
            Some(url::Host::Ipv6(a)) => self.check_ip(&a.to_string(), IpAddr::V6(a)),
            Some(url::Host::Domain(d)) if !d.is_empty() => Ok(()),
            _ => Err(Refusal::NoHost),
        }
    }

    /// Opens a `file://` source: only under a root, with a plain absolute path, through no
    /// symbolic link, a regular file. Nothing outside the roots is touched, not even looked at.
    pub fn open_file(&self, url: &url::Url) -> Result<std::fs::File, OpenError> {
        if self.file_roots.is_empty() {
            return Err(Refusal::NoFileRoots.into());
        }
        if url.scheme() != "file" || url.host_str().is_some_and(|h| !h.is_empty()) {
            return Err(Refusal::NotPlainPath.into());
        }
        let path = url.to_file_path().map_err(|()| Refusal::NotPlainPath)?;
        let text = path.to_str().ok_or(Refusal::NotPlainPath)?;
        let plain = text.starts_with('/')
            && text[1..]
                .split('/')
                .all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains('\0'));
        if !plain {
            return Err(Refusal::NotPlainPath.into());
        }
        if !self
            .file_roots
            .iter()
            .any(|r| path.starts_with(r) && path != *r)
        {
            return Err(Refusal::OutsideRoots.into());
        }
        let canonical = path.canonicalize().map_err(OpenError::Io)?;
        if canonical != path {
            return Err(Refusal::Symlink.into());
        }
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            &path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            if e == rustix::io::Errno::LOOP {
                OpenError::Refused(Refusal::Symlink)
            } else {
                OpenError::Io(e.into())
            }
        })?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(OpenError::Io)?;
        if !meta.is_file() {
            return Err(Refusal::NotRegular.into());
        }
        // A directory on the way swapped for a link between the check and the open: the open
        // file's real path tells.
        use std::os::fd::AsRawFd;
        if let Ok(real) = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
            && real != path
        {
            return Err(Refusal::Symlink.into());
        }
        Ok(file)
    }
}

/// A name lookup (the system resolver in the agent; scripted answers in tests).
pub trait Lookup: Send + Sync + 'static {
    fn lookup(&self, host: String)
    -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;
}

/// The system resolver, through tokio.
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(
        &self,
        host: String,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// reqwest's resolver: resolves once, refuses the name if any address is refused, and hands the
/// client exactly the checked addresses.
pub struct PolicyResolver {
    pub policy: Arc<FetchPolicy>,
    pub lookup: Arc<dyn Lookup>,
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let policy = self.policy.clone();
        let lookup = self.lookup.lookup(host.clone());
        Box::pin(async move {
            let addrs = lookup.await?;
            if addrs.is_empty() {
                return Err(Box::new(Refusal::NoAddress { host }) as _);
            }
            for a in &addrs {
                if let Err(refusal) = policy.check_ip(&host, *a) {
                    tracing::warn!(host = %host, address = %a, "refused a resolved address");
                    return Err(Box::new(refusal) as _);
                }
            }
            let checked: Vec<SocketAddr> =
                addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect();
            Ok(Box::new(checked.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Redirects: at most [`MAX_REDIRECTS`], never from https to http, each target checked like the
/// first URL (names are then checked by the resolver when the client connects).
pub fn redirect_policy(policy: Arc<FetchPolicy>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(Refusal::TooManyRedirects);
        }
        let from_https = attempt
            .previous()
            .last()
            .is_some_and(|u| u.scheme() == "https");
        if from_https && attempt.url().scheme() == "http" {
            return attempt.error(Refusal::Downgrade);
        }
        match policy.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(e) => attempt.error(e),
        }
    })
}

/// The HTTP client of the localizer: no proxy (a proxy would resolve and connect past the
/// policy), the policy's resolver and redirect rules, and the time limits.
pub fn http_client(
    policy: Arc<FetchPolicy>,
    lookup: Arc<dyn Lookup>,
    timeout: std::time::Duration,
) -> reqwest::Result<reqwest::Client> {
    // reqwest is built without a bundled crypto provider; use ring, as kube does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(std::time::Duration::from_secs(10))
        .no_proxy()
        .redirect(redirect_policy(policy.clone()))
        .dns_resolver(PolicyResolver { policy, lookup })
        .build()
}

/// A flag value that is not an address range.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not an address range: write it like 10.20.0.0/16, fd00::/8 or 10.1.2.3")]
pub struct NotACidr(String);

/// Parses a CIDR, or a single address as its own /32 or /128 (for `--fetch-allow-cidr`).
pub fn parse_cidr(s: &str) -> Result<IpNet, NotACidr> {
    if let Ok(n) = s.parse::<IpNet>() {
        return Ok(n.trunc());
    }
    s.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| NotACidr(s.to_string()))
}

#[cfg(test)]
mod tests;
