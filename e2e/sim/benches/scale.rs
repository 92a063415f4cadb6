//! Scale of the simulator's API server: loads 5,000 nodes and 150,000 pods, then measures a
//! full paginated list of all pods through HTTP with a kube client (limit 500), against a
//! baseline of the same list over a 5,000-pod server measured in the same run, and a watch
//! fan-out of one change to 200 watchers.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use ebb_sim::api::{Api, Ctx};
use ebb_sim::scenario::{NodeGen, node_object};
use ebb_sim::{Sim, SimConfig};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn populate(api: &Api, nodes: usize, pods: usize) -> Duration {
    let started = Instant::now();
    let ctx = Ctx::system("bench");
    let (Some(nri), Some(pri)) = (
        api.resolve("", "v1", "nodes"),
        api.resolve("", "v1", "pods"),
    ) else {
        panic!("nodes and pods are served");
    };
    let g = NodeGen {
        count: nodes,
        name_prefix: "node-".into(),
        cpu: "64".into(),
        memory: "256Gi".into(),
        pods: 110,
        labels: Default::default(),
        taints: vec![],
    };
    for i in 0..nodes {
        api.create(&ctx, &nri, "", node_object(&format!("node-{i}"), &g, i))
            .expect("node created");
    }
    for i in 0..pods {
        let pod = json!({"metadata": {"name": format!("pod-{i}"), "labels": {"app": format!("app-{}", i % 1000)},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("rs-{}", i % 1000),
                "uid": format!("rs-uid-{}", i % 1000), "controller": true}]},
            "spec": {"nodeName": format!("node-{}", i % nodes.max(1)),
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}});
        api.create(&ctx, &pri, "default", pod).expect("pod created");
        if (i + 1) % 50_000 == 0 {
            eprintln!("  loaded {} pods", i + 1);
        }
    }
    started.elapsed()
}

async fn list_all(client: kube::Client) -> usize {
    let pods: kube::Api<Pod> = kube::Api::all(client);
    let mut lp = ListParams::default().limit(500);
    let mut n = 0;
    loop {
        let page = pods.list(&lp).await.expect("page");
        n += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return n,
        }
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cfg = SimConfig {
        audit: false,
        history_limit: 1000,
        ..SimConfig::api_only()
    };
    let (big, small) = rt.block_on(async {
        (
            Sim::start(cfg.clone()).await.expect("sim"),
            Sim::start(cfg).await.expect("sim"),
        )
    });
    let t_small = populate(&small.api, 500, 5_000);
    eprintln!("loaded 500 nodes / 5,000 pods in {:.2?}", t_small);
    let t_big = populate(&big.api, 5_000, 150_000);
    eprintln!(
        "loaded 5,000 nodes / 150,000 pods in {:.2?} ({:.0} objects/s)",
        t_big,
        155_000.0 / t_big.as_secs_f64()
    );
    let (cb, cs) = rt.block_on(async {
        (
            big.client().await.expect("client"),
            small.client().await.expect("client"),
        )
    });
    let once = Instant::now();
    let n = rt.block_on(list_all(cb.clone()));
    assert_eq!(n, 150_000);
    eprintln!(
        "one full paginated list of {n} pods: {:.2?}",
        once.elapsed()
    );

    let mut g = c.benchmark_group("list_pods_paginated_500");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("baseline_5k_pods", |b| {
        b.iter(|| rt.block_on(list_all(cs.clone())))
    });
    g.bench_function("150k_pods", |b| {
        b.iter(|| rt.block_on(list_all(cb.clone())))
    });
    g.finish();

    // Watch fan-out: one change reaches 200 watchers.
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(cs.clone(), "default");
    let mut g = c.benchmark_group("watch_fanout");
    g.sample_size(10);
    for watchers in [1usize, 200] {
        g.bench_function(format!("{watchers}_watchers"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let rv = small.api.resource_version().to_string();
                    let mut streams = Vec::new();
                    for _ in 0..watchers {
                        streams.push(
                            cms.watch(&WatchParams::default().timeout(10), &rv)
                                .await
                                .expect("watch")
                                .boxed(),
                        );
                    }
                    let cm: ConfigMap =
                        serde_json::from_value(json!({"metadata": {"generateName": "fan-"}}))
                            .expect("cm");
                    cms.create(&PostParams::default(), &cm)
                        .await
                        .expect("create");
                    let all =
                        futures::future::join_all(streams.into_iter().map(|mut s| async move {
                            matches!(s.try_next().await, Ok(Some(WatchEvent::Added(_))))
                        }))
                        .await;
                    assert!(all.into_iter().all(|ok| ok));
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
