"""Runs one Helm action on the ebb chart with the Helm library (helm-sdkpy) and prints the outcome
as one JSON object: {"ok": true, "result": ...} or {"ok": false, "error": "<Helm's message>"}.
Used by e2e/tests/chart.rs.

  helm_chart.py lint CHART_DIR
  helm_chart.py install KUBECONFIG NAMESPACE RELEASE CHART_DIR VALUES_JSON
  helm_chart.py upgrade KUBECONFIG NAMESPACE RELEASE CHART_DIR VALUES_JSON
  helm_chart.py uninstall KUBECONFIG NAMESPACE RELEASE
"""
import asyncio
import json
import os
import sys

import helm_sdkpy as helm

# EBB_HELM_TIMEOUT_SECONDS: how long install, upgrade and uninstall wait (real pods start slower).
TIMEOUT_SECONDS = int(os.environ.get("EBB_HELM_TIMEOUT_SECONDS", "60"))


async def act(args: list[str]):
    verb = args[0]
    if verb == "lint":
        return await helm.Lint(helm.Configuration(namespace="default")).run(args[1])
    kubeconfig, namespace, release = args[1], args[2], args[3]
    cfg = helm.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    if verb == "install":
        return await helm.Install(cfg).run(
            release, args[4], values=json.loads(args[5]), create_namespace=True,
            wait=True, timeout=TIMEOUT_SECONDS)
    if verb == "upgrade":
        return await helm.Upgrade(cfg).run(
            release, args[4], values=json.loads(args[5]), wait=True, timeout=TIMEOUT_SECONDS)
    if verb == "uninstall":
        return await helm.Uninstall(cfg).run(release, wait=True, timeout=TIMEOUT_SECONDS)
    raise SystemExit(f"unknown action {verb!r}")


def main() -> None:
    try:
        result = asyncio.run(act(sys.argv[1:]))
        print(json.dumps({"ok": True, "result": result}, default=str))
    except helm.HelmError as e:
        print(json.dumps({"ok": False, "error": str(e)}))


if __name__ == "__main__":
    main()
