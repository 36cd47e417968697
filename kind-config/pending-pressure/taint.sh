#!/usr/bin/env bash
# Pending pressure, variant 2: hold new pods Pending by tainting the kind worker nodes.
#
#   kind-config/pending-pressure/taint.sh hold      # new pods stay Pending (Unschedulable)
#   kind-config/pending-pressure/taint.sh release   # remove the taint: Pending pods start
#   kind-config/pending-pressure/taint.sh status
#
# NoSchedule never evicts running pods, so the Airflow components keep running; but a component
# pod that is recreated while the hold is on (e.g. the scheduler failover scenario) also stays
# Pending. Worker pods are created (unlike the quota variant), so this exercises the pod-level
# races: stale Pending pods that start after the TI moved on (clear churn, stuck-in-queued).
set -euo pipefail

CLUSTER_NAME="${KIND_CLUSTER_NAME:-fenced-k8s}"
TAINT_KEY="fenced-k8s-executor.io/hold"
NODE_SELECTOR="fenced-k8s-executor.io/lab-node"

command -v kubectl >/dev/null 2>&1 || { echo "taint.sh: kubectl not on PATH (https://kubernetes.io/docs/tasks/tools/)" >&2; exit 2; }
CTX=(--context "kind-${CLUSTER_NAME}")

nodes() { kubectl "${CTX[@]}" get nodes -l "${NODE_SELECTOR}" -o name; }

case "${1:-}" in
  hold)
    for n in $(nodes); do kubectl "${CTX[@]}" taint --overwrite "$n" "${TAINT_KEY}=true:NoSchedule"; done ;;
  release)
    for n in $(nodes); do kubectl "${CTX[@]}" taint "$n" "${TAINT_KEY}:NoSchedule-" 2>/dev/null || true; done ;;
  status)
    kubectl "${CTX[@]}" get nodes -l "${NODE_SELECTOR}" \
      -o custom-columns='NODE:.metadata.name,TAINTS:.spec.taints[*].key' ;;
  *)
    echo "usage: $0 hold|release|status" >&2; exit 2 ;;
esac
