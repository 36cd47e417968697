#!/usr/bin/env bash
# Delete the kind lab cluster (and with it the Airflow release and every pod).
#   kind-config/down.sh            # delete cluster ${KIND_CLUSTER_NAME:-fenced-k8s}
#   KEEP_SECRETS=1 kind-config/down.sh   # keep out/kind/<cluster>-secrets.yaml
set -euo pipefail

KIND_CLUSTER_NAME="${KIND_CLUSTER_NAME:-fenced-k8s}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

command -v kind >/dev/null 2>&1 || { echo "down.sh: kind not on PATH (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)" >&2; exit 2; }

if kind get clusters 2>/dev/null | grep -qx "${KIND_CLUSTER_NAME}"; then
  kind delete cluster --name "${KIND_CLUSTER_NAME}"
else
  echo "down.sh: no kind cluster named ${KIND_CLUSTER_NAME}"
fi
if [[ "${KEEP_SECRETS:-0}" != "1" ]]; then
  rm -f "${ROOT}/out/kind/${KIND_CLUSTER_NAME}-secrets.yaml"
fi
