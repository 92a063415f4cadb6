use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn policy(cfg: PolicyConfig) -> FetchPolicy {
    FetchPolicy::new(cfg).unwrap()
}

fn cidrs(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|c| parse_cidr(c).unwrap()).collect()
}

#[test]
fn ipv4_classes() {
    let p = policy(PolicyConfig::default());
    for (addr, class) in [
        ("8.8.8.8", AddressClass::Public),
        ("127.0.0.1", AddressClass::Loopback),
        ("127.255.0.9", AddressClass::Loopback),
        ("169.254.169.254", AddressClass::LinkLocal),
        ("10.1.2.3", AddressClass::Private),
        ("172.16.0.1", AddressClass::Private),
        ("172.32.0.1", AddressClass::Public),
        ("192.168.1.1", AddressClass::Private),
        ("100.64.0.1", AddressClass::Private),
        ("0.0.0.0", AddressClass::Unspecified),
        ("0.1.2.3", AddressClass::Unspecified),
        ("224.0.0.1", AddressClass::Multicast),
        ("255.255.255.255", AddressClass::Broadcast),
        ("240.0.0.1", AddressClass::Reserved),
    ] {
        assert_eq!(p.classify(ip(addr)), class, "{addr}");
    }
    assert!(p.check_ip("dns.google", ip("8.8.8.8")).is_ok());
    for refused in ["127.0.0.1", "169.254.169.254", "10.0.0.1", "0.0.0.0"] {
        assert!(p.check_ip("h", ip(refused)).is_err(), "{refused}");
    }
}

#[test]
fn ipv6_classes_and_ipv4_inside_ipv6() {
    let p = policy(PolicyConfig::default());
    for (addr, class) in [
        ("2001:4860:4860::8888", AddressClass::Public),
        ("::1", AddressClass::Loopback),
        ("::", AddressClass::Unspecified),
        ("fe80::1", AddressClass::LinkLocal),
        ("fd00::1", AddressClass::Private),
        ("ff02::1", AddressClass::Multicast),
        // IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms of IPv4 addresses
        ("::ffff:127.0.0.1", AddressClass::Loopback),
        ("::ffff:169.254.169.254", AddressClass::LinkLocal),
        ("::ffff:10.0.0.1", AddressClass::Private),
        ("::127.0.0.1", AddressClass::Loopback),
        ("64:ff9b::a9fe:a9fe", AddressClass::LinkLocal),
        ("2002:7f00:1::", AddressClass::Loopback),
        ("::ffff:8.8.8.8", AddressClass::Public),
    ] {
        assert_eq!(p.classify(ip(addr)), class, "{addr}");
    }
    assert!(p.check_ip("h", ip("::ffff:127.0.0.1")).is_err());
    assert!(p.check_ip("h", ip("2001:4860:4860::8888")).is_ok());
}

#[test]
fn the_nodes_own_and_the_clusters_addresses() {
    let p = policy(PolicyConfig {
        cluster_cidrs: cidrs(&["198.51.100.0/24"]),
        allow_cidrs: cidrs(&["203.0.113.0/24", "10.0.0.0/8"]),
        ..PolicyConfig::default()
    });
    assert_eq!(
        p.classify(ip("198.51.100.7")),
        AddressClass::Cluster,
        "a public-looking cluster range"
    );
    assert!(p.check_ip("svc", ip("198.51.100.7")).is_err());
    p.set_node_addresses(vec![ip("203.0.113.5"), ip("10.0.0.5")]);
    for own in ["203.0.113.5", "::ffff:203.0.113.5", "10.0.0.5"] {
        assert_eq!(p.classify(ip(own)), AddressClass::NodeOwn, "{own}");
        assert!(
            p.check_ip("node", ip(own)).is_err(),
            "{own}: the node's own address, even inside an allowed range"
        );
    }
    assert!(p.check_ip("peer", ip("203.0.113.6")).is_ok());
    assert!(p.check_ip("peer", ip("10.9.9.9")).is_ok(), "allowed range");
}

#[test]
fn allow_lists_admit_private_and_loopback_but_never_link_local() {
    let p = policy(PolicyConfig {
        allow_hosts: vec!["artifacts.internal".into(), "*.svc.example".into()],
        allow_cidrs: cidrs(&["127.0.0.1", "0.0.0.0/0"]),
        ..PolicyConfig::default()
    });
    assert!(p.check_ip("x", ip("127.0.0.1")).is_ok());
    assert!(p.check_ip("x", ip("169.254.169.254")).is_err(), "metadata");
    assert!(p.check_ip("x", ip("::ffff:169.254.169.254")).is_err());
    let hosts = policy(PolicyConfig {
        allow_hosts: vec!["Artifacts.Internal.".into(), "*.svc.example".into()],
        ..PolicyConfig::default()
    });
    assert!(hosts.check_ip("artifacts.internal", ip("10.0.0.1")).is_ok());
    assert!(hosts.check_ip("a.svc.example", ip("10.0.0.1")).is_ok());
    assert!(hosts.check_ip("svc.example", ip("10.0.0.1")).is_err());
    assert!(hosts.check_ip("evilsvc.example", ip("10.0.0.1")).is_err());
    assert!(hosts.check_ip("other", ip("10.0.0.1")).is_err());
    assert!(
        hosts
            .check_ip("artifacts.internal", ip("169.254.169.254"))
            .is_err()
    );
    assert!(matches!(
        FetchPolicy::new(PolicyConfig {
            allow_hosts: vec!["http://x/".into()],
            ..PolicyConfig::default()
        }),
        Err(PolicyConfigError::BadHost { .. })
    ));
}

#[test]
fn urls_with_address_hosts_are_checked_before_any_request() {
    let p = policy(PolicyConfig::default());
    for url in [
        "http://127.0.0.1/",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://[::ffff:7f00:1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/",
    ] {
        let parsed = url::Url::parse(url).unwrap();
        assert!(p.check_url(&parsed).is_err(), "{url}");
    }
    assert!(
        p.check_url(&url::Url::parse("https://artifacts.example.com/a").unwrap())
            .is_ok(),
        "names are checked at resolution"
    );
    assert_eq!(
        p.check_url(&url::Url::parse("ftp://h/x").unwrap()),
        Err(Refusal::Scheme("ftp".into()))
    );
}

#[test]
fn cidrs_and_single_addresses_parse() {
    assert_eq!(parse_cidr("10.1.2.3").unwrap().to_string(), "10.1.2.3/32");
    assert_eq!(parse_cidr("10.1.2.3/8").unwrap().to_string(), "10.0.0.0/8");
    assert_eq!(parse_cidr("fd00::/8").unwrap().to_string(), "fd00::/8");
    assert!(parse_cidr("10.0.0.0/33").is_err());
    assert!(parse_cidr("example.com").is_err());
}

#[test]
fn file_roots_must_exist_and_stay_clear_of_the_agents_own_directories() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let artifacts = dir.path().join("artifacts");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&artifacts).unwrap();
    let with = |roots: Vec<PathBuf>| {
        FetchPolicy::new(PolicyConfig {
            file_roots: roots,
            own_dirs: vec![state.clone()],
            ..PolicyConfig::default()
        })
    };
    assert_eq!(
        with(vec![artifacts.clone()]).unwrap().file_roots(),
        &[artifacts.canonicalize().unwrap()]
    );
    for bad in [
        PathBuf::from("/"),
        dir.path().to_path_buf(),
        state.clone(),
        PathBuf::from("/var/run/secrets/kubernetes.io"),
        PathBuf::from("/proc/self"),
    ] {
        let err = with(vec![bad.clone()]).err();
        assert!(
            matches!(
                err,
                Some(PolicyConfigError::RootOverlaps { .. } | PolicyConfigError::Root { .. })
            ),
            "{bad:?}: {err:?}"
        );
    }
    assert!(matches!(
        with(vec![dir.path().join("missing")]),
        Err(PolicyConfigError::Root { .. })
    ));
}

/// A resolver that answers from a script, counting lookups.
struct Scripted {
    answers: Mutex<VecDeque<Vec<IpAddr>>>,
    calls: AtomicUsize,
}

impl Scripted {
    fn new(answers: Vec<Vec<&str>>) -> Arc<Scripted> {
        Arc::new(Scripted {
            answers: Mutex::new(
                answers
                    .into_iter()
                    .map(|a| a.into_iter().map(ip).collect())
                    .collect(),
            ),
            calls: AtomicUsize::new(0),
        })
    }
}

impl Lookup for Scripted {
    fn lookup(
        &self,
        _host: String,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let next = self.answers.lock().unwrap().pop_front().unwrap_or_default();
        Box::pin(async move { Ok(next) })
    }
}

/// A server on `bind` counting requests; `redirect` makes it answer 302 to that URL.
async fn counting(bind: &str, redirect: Option<String>) -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = Router::new().fallback(move || {
        h.fetch_add(1, Ordering::SeqCst);
        let redirect = redirect.clone();
        async move {
            match redirect {
                Some(to) => (StatusCode::FOUND, [(header::LOCATION, to)]).into_response(),
                None => "ok".into_response(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, hits)
}

fn only_127_0_0_1() -> Arc<FetchPolicy> {
    Arc::new(policy(PolicyConfig {
        allow_cidrs: cidrs(&["127.0.0.1/32"]),
        ..PolicyConfig::default()
    }))
}

fn client(p: &Arc<FetchPolicy>, lookup: Arc<dyn Lookup>) -> reqwest::Client {
    http_client(p.clone(), lookup, Duration::from_secs(5)).unwrap()
}

fn refusal_of(e: &reqwest::Error) -> Option<Refusal> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<Refusal>() {
            return Some(r.clone());
        }
        cause = c.source();
    }
    None
}

#[tokio::test]
async fn a_name_is_resolved_once_and_only_its_checked_answer_is_used() {
    let (good, good_hits) = counting("127.0.0.1:0", None).await;
    let (_, bad_hits) = counting("127.0.0.2:0", None).await;
    let p = only_127_0_0_1();
    // The first answer is allowed; the name then "rebinds" to a refused address.
    let dns = Scripted::new(vec![
        vec!["127.0.0.1"],
        vec!["127.0.0.2"],
        vec!["127.0.0.2"],
    ]);
    let resp = client(&p, dns.clone())
        .get(format!("http://rebind.test:{good}/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(good_hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        dns.calls.load(Ordering::SeqCst),
        1,
        "one resolution per request"
    );
    // A new connection resolves again and gets the refused answer: nothing is sent.
    let err = client(&p, dns.clone())
        .get(format!("http://rebind.test:{good}/x"))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(
            refusal_of(&err),
            Some(Refusal::Address {
                class: AddressClass::Loopback,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(bad_hits.load(Ordering::SeqCst), 0);
    assert_eq!(good_hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_answer_with_any_refused_address_is_refused_whole() {
    let (good, good_hits) = counting("127.0.0.1:0", None).await;
    let p = only_127_0_0_1();
    for answer in [
        vec!["127.0.0.1", "169.254.169.254"],
        vec!["169.254.169.254", "127.0.0.1"],
        vec!["127.0.0.1", "::ffff:10.0.0.1"],
        vec![],
    ] {
        let dns = Scripted::new(vec![answer.clone()]);
        let err = client(&p, dns)
            .get(format!("http://mixed.test:{good}/"))
            .send()
            .await
            .unwrap_err();
        assert!(refusal_of(&err).is_some(), "{answer:?}: {err:?}");
    }
    assert_eq!(good_hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn redirects_are_checked_at_every_hop() {
    let (inner, inner_hits) = counting("127.0.0.2:0", None).await;
    let p = only_127_0_0_1();
    // to a refused address literal
    let (to_addr, to_addr_hits) =
        counting("127.0.0.1:0", Some(format!("http://127.0.0.2:{inner}/x"))).await;
    // to a name that resolves to a refused address
    let (to_name, _) = counting("127.0.0.1:0", Some(format!("http://inner.test:{inner}/x"))).await;
    // to the metadata service
    let (to_meta, _) = counting(
        "127.0.0.1:0",
        Some("http://169.254.169.254/latest/meta-data/".into()),
    )
    .await;
    for port in [to_addr, to_name, to_meta] {
        let dns = Scripted::new(vec![vec!["127.0.0.2"]]);
        let err = client(&p, dns)
            .get(format!("http://127.0.0.1:{port}/start"))
            .send()
            .await
            .unwrap_err();
        assert!(refusal_of(&err).is_some(), "{port}: {err:?}");
    }
    assert!(to_addr_hits.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        inner_hits.load(Ordering::SeqCst),
        0,
        "a redirect target was requested"
    );
}

#[tokio::test]
async fn redirect_chains_are_bounded() {
    // A server redirecting to itself forever.
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().fallback(move || {
        let n = h.fetch_add(1, Ordering::SeqCst);
        async move {
            (
                StatusCode::FOUND,
                [(header::LOCATION, format!("http://127.0.0.1:{port}/{n}"))],
            )
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    let err = client(&only_127_0_0_1(), Scripted::new(vec![]))
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(refusal_of(&err), Some(Refusal::TooManyRedirects), "{err:?}");
    assert_eq!(hits.load(Ordering::SeqCst), MAX_REDIRECTS + 1);
}
