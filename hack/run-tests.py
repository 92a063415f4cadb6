#!/usr/bin/env python3
"""Runs the workspace's test binaries in parallel lanes: `cargo test --workspace` runs them one
after the other, and most of their time is spent waiting on control planes, not computing.

Usage: hack/run-tests.py [CARGO TEST ARGS...] [-- TEST BINARY ARGS...]

Builds every test target once (`cargo test --no-run`, with the cargo arguments given), then runs
the binaries in EBB_TEST_LANES lanes (default 3), the longest first (expected times below, from
the last measured run), each binary in its package's directory as cargo runs it. A binary's
output is printed in one piece when it ends; every binary runs even after a failure, and the
summary names each failing one. Doc tests run as one more job. Exits 1 if anything failed.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# Seconds each binary took in the last measured run (docs/testing.md): the order in which they
# start, longest first, so that no long binary starts last. The others take seconds (10 s here).
EXPECTED = {
    "ebb-bench::versus_smoke": 415,
    "ebb-e2e::scaledown": 385,
    "ebb-e2e::removal_capi": 254,
    "ebb-e2e::in_pod": 214,
    "ebb-e2e::failover": 178,
    "ebb-e2e::kubectl": 154,
    "ebb-e2e::security": 147,
    "ebb-e2e::placement": 122,
    "ebb-e2e::traces": 80,
    "ebb-e2e::cannot_move": 62,
    "ebb-e2e::pdb_pace": 55,
    "ebb-e2e::steering_admission": 51,
    "ebb-e2e::chart": 50,
    "ebb-e2e::removal_mixed": 46,
    "ebb-e2e::removal_karpenter": 44,
    "ebb-e2e::node_agent": 40,
}


def log(msg):
    print(f"==> {msg}", flush=True)


def build(cargo_args):
    """Builds every test target; returns [(name, executable, package directory)]."""
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        check=True, stdout=subprocess.PIPE, text=True,
    ).stdout)
    names = {p["manifest_path"]: p["name"] for p in meta["packages"]}
    cmd = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics", *cargo_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    found = []
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package = Path(msg["manifest_path"]).parent
        pkg_name = names.get(msg["manifest_path"], package.name)
        kind = target["kind"][0]
        name = f"{pkg_name}::{target['name']}" if kind == "test" else f"{pkg_name}::{kind} {target['name']}"
        found.append((name, msg["executable"], package, pkg_name))
    if proc.wait() != 0:
        sys.exit(f"run-tests: building the tests failed ({' '.join(cmd)})")
    return found


class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.rows = []

    def add(self, name, seconds, code, output):
        with self.lock:
            self.rows.append((name, seconds, code))
            status = "ok" if code == 0 else f"FAILED (exit {code})"
            print(f"\n==> {name}: {status} in {seconds:.0f} s", flush=True)
            sys.stdout.write(output)
            sys.stdout.flush()


def run_job(job, results):
    name, cmd, cwd, env = job
    start = time.monotonic()
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    results.add(name, time.monotonic() - start, proc.returncode, proc.stdout)


def main():
    args = sys.argv[1:]
    if "--" in args:
        i = args.index("--")
        cargo_args, binary_args = args[:i], args[i + 1 :]
    else:
        cargo_args, binary_args = args, []
    lanes = int(os.environ.get("EBB_TEST_LANES", "3"))
    if lanes < 1:
        sys.exit("run-tests: EBB_TEST_LANES must be at least 1")

    log(f"building the test binaries (cargo test --no-run {' '.join(cargo_args)})")
    jobs = []
    for name, exe, package, pkg_name in build(cargo_args):
        env = dict(os.environ, CARGO_MANIFEST_DIR=str(package), CARGO_PKG_NAME=pkg_name)
        jobs.append((name, [exe, *binary_args], package, env))
    # Doc tests: only when the whole workspace is tested (no package or target chosen).
    if not cargo_args or cargo_args == ["--workspace"]:
        jobs.append(("doc tests", ["cargo", "test", "--workspace", "--doc", "--no-fail-fast"], Path.cwd(), dict(os.environ)))
    jobs.sort(key=lambda j: EXPECTED.get(j[0], 10), reverse=True)
    log(f"running {len(jobs)} test binaries in {lanes} lanes, the longest first")

    results = Results()
    queue = list(jobs)
    queue_lock = threading.Lock()

    def lane():
        while True:
            with queue_lock:
                if not queue:
                    return
                job = queue.pop(0)
            run_job(job, results)

    start = time.monotonic()
    threads = [threading.Thread(target=lane) for _ in range(min(lanes, len(jobs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start

    print("\n==> test binaries, longest first:")
    for name, seconds, code in sorted(results.rows, key=lambda r: -r[1]):
        print(f"    {seconds:7.0f} s  {'ok    ' if code == 0 else 'FAILED'}  {name}")
    failed = [r for r in results.rows if r[2] != 0]
    busy = sum(r[1] for r in results.rows)
    log(f"{len(results.rows)} binaries in {wall:.0f} s on {lanes} lanes ({busy:.0f} s one after the other)")
    if failed:
        log("FAILED: " + ", ".join(r[0] for r in failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
