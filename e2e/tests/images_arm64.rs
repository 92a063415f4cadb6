//! The linux/arm64 images run: their binaries, taken out of the multi-arch index the way a node
//! pulls them, on an emulated arm64 machine (the node agent's LMDB store across a SIGKILL, on
//! Debian's arm64 kernel) and under user-mode emulation (the controller against a cluster).
//!
//! Needs qemu-system-aarch64, qemu-aarch64-static, cpio, skopeo and the kernel kit that
//! `hack/test.sh install` unpacks into `EBB_ARM64_KIT` (default `~/.cache/ebb-arm64`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use ebb_e2e::SimConfig;
use ebb_e2e::harness::{Backend, TestEnv, wait_for, which};
use ebb_e2e::images;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::Value;

/// How an image's config says it starts and for which architecture.
struct Unpacked {
    architecture: String,
    entrypoint: String,
}

/// Unpacks the linux/arm64 image of the OCI archive `archive` (a multi-arch index) into
/// `rootfs`, layer by layer, as containerd on an arm64 node would.
async fn unpack_arm64(archive: &Path, rootfs: &Path) -> anyhow::Result<Unpacked> {
    let tmp = tempfile::tempdir()?;
    let copied = tmp.path().join("image");
    run(tokio::process::Command::new(which("skopeo")?)
        .args([
            "copy",
            "-q",
            "--override-os",
            "linux",
            "--override-arch",
            "arm64",
        ])
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("dir:{}", copied.display())))
    .await?;
    let manifest: Value = serde_json::from_slice(&std::fs::read(copied.join("manifest.json"))?)?;
    let blob = |v: &Value| -> anyhow::Result<PathBuf> {
        let digest = v["digest"]
            .as_str()
            .context("a descriptor without a digest")?;
        Ok(copied.join(digest.trim_start_matches("sha256:")))
    };
    let config: Value = serde_json::from_slice(&std::fs::read(blob(&manifest["config"])?)?)?;
    std::fs::create_dir_all(rootfs)?;
    for layer in manifest["layers"]
        .as_array()
        .context("a manifest without layers")?
    {
        run(tokio::process::Command::new("tar")
            .arg("-xzf")
            .arg(blob(layer)?)
            .arg("-C")
            .arg(rootfs))
        .await?;
    }
    Ok(Unpacked {
        architecture: config["architecture"].as_str().unwrap_or_default().into(),
        entrypoint: config["config"]["Entrypoint"][0]
            .as_str()
            .unwrap_or_default()
            .into(),
    })
}

/// The linux/arm64 image of `name` (ebb-controller, ebb-node-agent) from the current build,
/// unpacked into `rootfs`.
async fn arm64_image(name: &str, rootfs: &Path) -> Unpacked {
    let built = images::build().await.expect("the images build");
    let archive = built
        .archives
        .iter()
        .find(|a| a.to_string_lossy().contains(name))
        .unwrap_or_else(|| panic!("an {name} archive in {:?}", built.archives));
    let image = unpack_arm64(archive, rootfs)
        .await
        .expect("the arm64 image unpacks");
    assert_eq!(
        image.architecture, "arm64",
        "the index's arm64 image of {name}"
    );
    image
}

async fn run(cmd: &mut tokio::process::Command) -> anyhow::Result<Vec<u8>> {
    let out = cmd.stdin(Stdio::null()).output().await?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// The kernel kit of `hack/test.sh install`.
fn kit() -> PathBuf {
    let kit = std::env::var_os("EBB_ARM64_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ebb-arm64")
        });
    assert!(
        kit.join("vmlinuz").is_file() && kit.join("busybox").is_file(),
        "no arm64 kernel and busybox in {}: `hack/test.sh install` downloads them (Debian's linux-image-arm64 and busybox-static:arm64)",
        kit.display()
    );
    kit
}

/// The init of the arm64 machine: starts the image's node agent writing container transitions,
/// SIGKILLs it once 200 are acknowledged, then prints the acknowledgements and the store as the
/// agent's `dump` reads it back, between markers, and powers off.
const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
echo "ebb-arm64: machine $($B uname -m)"
AGENT=@AGENT@
# The file exists before the writer starts: on a busy host the loop below may run before the
# background job has opened it.
: >/tmp/acks
$AGENT crash-writer --state-dir /var/lib/ebb --transitions 6000 --submitters 4 >/tmp/acks 2>/tmp/err &
W=$!
i=0
while [ "$($B wc -l </tmp/acks)" -lt 200 ] && [ $i -lt 3000 ]; do $B usleep 20000; i=$((i + 1)); done
$B kill -9 $W
wait $W
echo "ebb-arm64: writer exit $?"
$B cat /tmp/err
echo "ebb-arm64: acks begin"
$B cat /tmp/acks
echo "ebb-arm64: acks end"
$AGENT dump --state-dir /var/lib/ebb >/tmp/dump.json 2>/tmp/err
echo "ebb-arm64: dump exit $?"
$B cat /tmp/err
echo "ebb-arm64: dump begin"
$B cat /tmp/dump.json
echo
echo "ebb-arm64: dump end"
$B poweroff -f
"#;

/// The lines of `console` between `ebb-arm64: <what> begin` and `... end`.
fn section<'a>(console: &'a str, what: &str) -> Vec<&'a str> {
    console
        .lines()
        .skip_while(|l| *l != format!("ebb-arm64: {what} begin"))
        .skip(1)
        .take_while(|l| *l != format!("ebb-arm64: {what} end"))
        .collect()
}

/// The arm64 node agent, as its image holds it, on Debian's arm64 kernel (qemu-system-aarch64,
/// a Cortex-A57): every transition it acknowledged before a SIGKILL is in its store after.
#[tokio::test]
async fn the_arm64_node_agent_keeps_acknowledged_state_across_a_kill_on_an_arm64_kernel() {
    let qemu = which("qemu-system-aarch64").expect(
        "qemu-system-aarch64 (Debian: qemu-system-arm; `hack/test.sh install` installs it)",
    );
    let cpio = which("cpio").expect("cpio (Debian: cpio; `hack/test.sh install` installs it)");
    let kit = kit();
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    let image = arm64_image("ebb-node-agent", &rootfs).await;
    assert!(
        image.entrypoint.ends_with("ebb-node-agent"),
        "{}",
        image.entrypoint
    );
    for d in ["bin", "dev", "proc", "tmp", "var/lib"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy(kit.join("busybox"), rootfs.join("bin/busybox")).unwrap();
    let init = rootfs.join("init");
    std::fs::write(&init, INIT.replace("@AGENT@", &image.entrypoint)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The initramfs: the image's own files, busybox and the init above.
    let initrd = dir.path().join("initrd.cpio");
    let list = run(tokio::process::Command::new("find")
        .arg(".")
        .current_dir(&rootfs))
    .await
    .unwrap();
    let mut child = tokio::process::Command::new(cpio)
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(&rootfs)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&initrd).unwrap())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&list).await.unwrap();
    }
    assert!(child.wait().await.unwrap().success(), "cpio");

    let boot = tokio::process::Command::new(qemu)
        .args([
            "-M",
            "virt",
            "-cpu",
            "cortex-a57",
            "-m",
            "1024",
            "-smp",
            "2",
        ])
        .args(["-nic", "none", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(kit.join("vmlinuz"))
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyAMA0 panic=-1 quiet"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), boot)
        .await
        .expect("the arm64 machine powers off within 10 minutes")
        .expect("qemu-system-aarch64 runs");
    let console = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(
        console.contains("ebb-arm64: machine aarch64"),
        "an arm64 machine:\n{console}"
    );
    assert!(
        console.contains("ebb-arm64: writer exit 137"),
        "the writer was killed mid-run:\n{console}"
    );
    assert!(
        console.contains("ebb-arm64: dump exit 0"),
        "dump reads the store:\n{console}"
    );
    let acked: BTreeSet<(u64, u64)> = section(&console, "acks")
        .iter()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            (p.next() == Some("ack")).then_some(())?;
            Some((p.next()?.parse().ok()?, p.next()?.parse().ok()?))
        })
        .collect();
    assert!(
        acked.len() >= 200,
        "200 or more transitions acknowledged before the kill, got {}",
        acked.len()
    );
    let dump: Value = serde_json::from_str(&section(&console, "dump").join("\n"))
        .unwrap_or_else(|e| panic!("the dump is JSON ({e}):\n{console}"));
    let containers = dump["containers"].as_array().expect("containers");
    for &(c, step) in &acked {
        let uid = format!("uid-{c:06}");
        let rec = containers
            .iter()
            .find(|r| r["podUid"] == uid.as_str())
            .unwrap_or_else(|| panic!("acknowledged container {uid} missing from the store"));
        match step {
            0 => assert_eq!(rec["requested"]["pod_name"], format!("pod-{c}")),
            1 => assert_eq!(rec["launchedAt"], c),
            _ => assert_eq!(rec["completed"]["exit_code"], c % 256),
        }
    }
    eprintln!(
        "arm64 machine: {} transitions acknowledged before the kill, {} containers in the store",
        acked.len(),
        containers.len()
    );
}

/// The arm64 controller, as its image holds it, under qemu-aarch64-static: it reaches the API
/// server over TLS and takes its Lease.
#[tokio::test]
async fn the_arm64_controller_takes_its_lease_under_emulation() {
    let qemu = which("qemu-aarch64-static").expect(
        "qemu-aarch64-static (Debian: qemu-user-static; `hack/test.sh install` installs it)",
    );
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    let image = arm64_image("ebb-controller", &rootfs).await;
    let binary = rootfs.join(image.entrypoint.trim_start_matches('/'));
    let version = run(tokio::process::Command::new(&qemu)
        .arg(&binary)
        .arg("--version"))
    .await
    .expect("the arm64 controller prints its version");
    assert!(
        String::from_utf8_lossy(&version).starts_with("ebb-controller "),
        "{}",
        String::from_utf8_lossy(&version)
    );

    let env = TestEnv::start_on(Backend::Sim, SimConfig::default(), 1)
        .await
        .expect("environment starts");
    let _controller = tokio::process::Command::new(&qemu)
        .arg(&binary)
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--identity",
            "arm64",
        ])
        .args(["--namespace", "default"])
        .env("KUBECONFIG", &env.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("qemu-aarch64-static starts");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
    let held = wait_for(
        "the Lease held by the arm64 controller",
        Duration::from_secs(120),
        || async {
            let lease = leases.get_opt("ebb-controller").await.ok().flatten()?;
            let holder = lease.spec?.holder_identity?;
            (holder == "arm64").then_some(holder)
        },
    )
    .await;
    if let Err(e) = held {
        panic!("{e:#}");
    }
}
