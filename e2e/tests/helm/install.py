"""Installs a chart with the Helm library (helm-sdkpy) against a kubeconfig, waiting for
readiness, then prints the release status as JSON. Used by e2e/tests/helm.rs."""
import asyncio
import json
import sys

import helm_sdkpy as helm


async def main(kubeconfig: str, chart: str, release: str) -> None:
    cfg = helm.Configuration(namespace="default", kubeconfig=kubeconfig)
    result = await helm.Install(cfg).run(release, chart, values={"message": "from-test"}, wait=True, timeout=60)
    status = await helm.Status(cfg).run(release)
    releases = await helm.List(cfg).run()
    print(json.dumps({"install": result, "status": status, "list": releases}, default=str))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
