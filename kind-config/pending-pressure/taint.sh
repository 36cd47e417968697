#!/usr/bin/env bash
# Pending pressure, variant 2: hold new pods Pending with a NoSchedule taint on the nodes.
#
#   kind-config/pending-pressure/taint.sh hold      # new worker pods stay Pending (Unschedulable)
#   kind-config/pending-pressure/taint.sh release   # remove the taint: Pending pods start
#   kind-config/pending-pressure/taint.sh status
#
# Any cluster: the current context of $KUBECONFIG (else ~/.kube/config). The nodes labelled
# fenced-k8s-executor.io/lab-node (kind-config/cluster.yaml's workers), or every node when none
# is labelled (a single-node cluster such as ../shared/node). NoSchedule never evicts running pods;
# the Airflow components and the database tolerate the taint (kind-config/node/values.yaml,
# kind-config/postgres.yaml), so only worker pods are held, and a component pod recreated during
# the hold still schedules. The logic is lab/fenced_k8s_lab/hold.py (what tests/kind uses).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
command -v kubectl >/dev/null 2>&1 || { echo "taint.sh: kubectl not on PATH (https://kubernetes.io/docs/tasks/tools/)" >&2; exit 2; }
PYTHONPATH="${ROOT}:${ROOT}/lab${PYTHONPATH:+:${PYTHONPATH}}" exec "${PYTHON:-python3}" -m fenced_k8s_lab.hold "$@"
