#!/bin/sh
# Runs once in the kernel-marathon image (installed there as /usr/local/bin/marathon-init-temporal)
# after the server is up (compose service temporal-init, the Kubernetes Job marathon-init): waits for the frontend, creates the namespace if it is missing, and
# registers the Marathon* search attributes with the project's own idempotent function
# (cli/server.py register_search_attributes), so the names and types cannot drift from the code:
#   MarathonProblem Keyword, MarathonIteration Int, MarathonBestSpeedup Double, MarathonPhase Keyword.
# Connection settings come from the temporal envconfig profile and the TEMPORAL_* variables
# (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS*), which both the temporal CLI
# and the marathon code read. MARATHON_CREATE_NAMESPACE=0 skips the namespace step (Temporal Cloud,
# or a cluster whose namespaces are managed elsewhere).
set -eu
NAMESPACE="${TEMPORAL_NAMESPACE:-default}"
RETENTION="${MARATHON_NAMESPACE_RETENTION:-30d}"

echo "init: waiting for Temporal at ${TEMPORAL_ADDRESS:-the profile's address}"
i=0
until temporal operator cluster health >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -ge 90 ]; then
    echo "init: Temporal is not healthy after 180 s:" >&2
    temporal operator cluster health >&2 || true
    exit 1
  fi
  sleep 2
done

if [ "${MARATHON_CREATE_NAMESPACE:-1}" = "1" ]; then
  if temporal operator namespace describe --namespace "$NAMESPACE" >/dev/null 2>&1; then
    echo "init: namespace $NAMESPACE exists"
  else
    echo "init: creating namespace $NAMESPACE (retention $RETENTION)"
    temporal operator namespace create --namespace "$NAMESPACE" --retention "$RETENTION"
  fi
fi

python - <<'PY'
import asyncio
import sys

from cli.server import register_search_attributes
from workflows.client import connect


async def main() -> int:
    client = await connect(timeout=30)
    last = None
    for _ in range(30):  # a namespace created a moment ago may not be visible to every frontend yet
        try:
            await register_search_attributes(client)
            print(f"init: search attributes registered in namespace {client.namespace}")
            return 0
        except Exception as e:  # noqa: BLE001 - report the last error after the retries
            last = e
            await asyncio.sleep(2)
    print(f"init: cannot register search attributes: {last}", file=sys.stderr)
    return 1


sys.exit(asyncio.run(main()))
PY
temporal operator search-attribute list --namespace "$NAMESPACE" | grep Marathon
