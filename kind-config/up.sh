#!/usr/bin/env bash
# Create (or reuse) the kind cluster and install Airflow HA with the stock or the fenced executor.
#
#   kind-config/up.sh fenced      # FencedKubernetesExecutor, helm-values/fenced-ha.yaml
#   kind-config/up.sh stock       # stock KubernetesExecutor, helm-values/stock-ha.yaml
#
# Idempotent: re-running with the other flavour rebuilds/loads the image and `helm upgrade`s the
# release in place. Use kind-config/down.sh to delete everything.
#
# Overridable through the environment:
#   KIND_CLUSTER_NAME   (fenced-k8s)    AIRFLOW_NAMESPACE (airflow)   RELEASE (airflow)
#   CHART_VERSION       (see below)     AIRFLOW_IMAGE_TAG (3.3.2)     IMAGE (fenced-k8s-executor:dev)
#   SKIP_BUILD=1        reuse an image already loaded into the cluster
#   HELM_TIMEOUT        (15m)
set -euo pipefail

# Official apache-airflow chart version. NOT verified on this project's machines (no Docker).
# 1.22.0 was the newest chart found in public sources (appVersion 3.2.2); the values files set
# airflowVersion 3.3.2 and point images.airflow at our image. Bump when a chart with
# appVersion 3.3.x is published: `helm search repo apache-airflow/airflow --versions`.
CHART_VERSION="${CHART_VERSION:-1.22.0}"
CHART_REPO_NAME="apache-airflow"
CHART_REPO_URL="https://airflow.apache.org"

KIND_CLUSTER_NAME="${KIND_CLUSTER_NAME:-fenced-k8s}"
AIRFLOW_NAMESPACE="${AIRFLOW_NAMESPACE:-airflow}"
RELEASE="${RELEASE:-airflow}"
AIRFLOW_IMAGE_TAG="${AIRFLOW_IMAGE_TAG:-3.3.2}"
IMAGE="${IMAGE:-fenced-k8s-executor:dev}"
HELM_TIMEOUT="${HELM_TIMEOUT:-15m}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/.." && pwd)"

usage() { echo "usage: $0 stock|fenced" >&2; exit 2; }
FLAVOUR="${1:-}"
case "${FLAVOUR}" in stock|fenced) ;; *) usage ;; esac
VALUES="${ROOT}/helm-values/${FLAVOUR}-ha.yaml"
[[ -f "${VALUES}" ]] || { echo "up.sh: missing ${VALUES}" >&2; exit 2; }

missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$1 ($2)"); }
need docker  "https://docs.docker.com/engine/install/"
need kind    "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
need helm    "https://helm.sh/docs/intro/install/"
if ((${#missing[@]})); then
  echo "up.sh: required tools not on PATH:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 2
fi
docker info >/dev/null 2>&1 || { echo "up.sh: docker is installed but the engine does not answer (is the daemon running? can this user use it?)" >&2; exit 2; }

CTX="kind-${KIND_CLUSTER_NAME}"
log() { printf '\n==> %s\n' "$*"; }

# 1. Cluster
if kind get clusters 2>/dev/null | grep -qx "${KIND_CLUSTER_NAME}"; then
  log "reusing kind cluster ${KIND_CLUSTER_NAME}"
else
  log "creating kind cluster ${KIND_CLUSTER_NAME}"
  kind create cluster --name "${KIND_CLUSTER_NAME}" --config "${HERE}/cluster.yaml" --wait 120s
fi
kubectl config use-context "${CTX}" >/dev/null

# 2. Image (runtime + the reproduction DAG), loaded into every node
if [[ "${SKIP_BUILD:-0}" != "1" ]]; then
  log "building ${IMAGE} (FROM apache/airflow:${AIRFLOW_IMAGE_TAG})"
  docker build --target kind --build-arg "AIRFLOW_IMAGE_TAG=${AIRFLOW_IMAGE_TAG}" -t "${IMAGE}" "${ROOT}"
  log "loading ${IMAGE} into ${KIND_CLUSTER_NAME}"
  kind load docker-image "${IMAGE}" --name "${KIND_CLUSTER_NAME}"
fi

# 3. Namespaces (worker pods run in the release namespace; see pending-pressure/quota.yaml)
log "namespace ${AIRFLOW_NAMESPACE}"
kubectl --context "${CTX}" create namespace "${AIRFLOW_NAMESPACE}" --dry-run=client -o yaml \
  | kubectl --context "${CTX}" apply -f -

# Stable secrets shared by every Airflow process (the scheduler signs the workload JWT that the
# api-server verifies; the fernet key must not change across upgrades). Generated once.
SECRETS_FILE="${ROOT}/out/kind/${KIND_CLUSTER_NAME}-secrets.yaml"
if [[ ! -f "${SECRETS_FILE}" ]]; then
  mkdir -p "$(dirname "${SECRETS_FILE}")"
  rnd() { head -c 32 /dev/urandom | base64 | tr '+/' '-_' ; }
  umask 077
  cat >"${SECRETS_FILE}" <<YAML
fernetKey: "$(rnd)"
apiSecretKey: "$(rnd)"
jwtSecret: "$(rnd)"
YAML
fi

# 4. Chart
log "helm repo ${CHART_REPO_NAME} (${CHART_REPO_URL})"
helm repo add "${CHART_REPO_NAME}" "${CHART_REPO_URL}" --force-update >/dev/null
helm repo update "${CHART_REPO_NAME}" >/dev/null

log "helm upgrade --install ${RELEASE} ${CHART_REPO_NAME}/airflow --version ${CHART_VERSION} (${FLAVOUR})"
# The pending-pressure quota (if left behind) would block the rollout.
kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" delete resourcequota fenced-repro-pod-pressure --ignore-not-found
"${HERE}/pending-pressure/taint.sh" release

helm upgrade --install "${RELEASE}" "${CHART_REPO_NAME}/airflow" \
  --kube-context "${CTX}" \
  --namespace "${AIRFLOW_NAMESPACE}" \
  --version "${CHART_VERSION}" \
  --values "${VALUES}" \
  --values "${SECRETS_FILE}" \
  --set "images.airflow.repository=${IMAGE%%:*}" \
  --set-string "images.airflow.tag=${IMAGE##*:}" \
  --wait --timeout "${HELM_TIMEOUT}"

# 5. Rollout
log "waiting for rollout"
for d in scheduler api-server dag-processor triggerer; do
  if kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" get deploy "${RELEASE}-${d}" >/dev/null 2>&1; then
    kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" rollout status "deploy/${RELEASE}-${d}" --timeout=10m
  fi
done
# A new image under the same tag is not picked up by `helm upgrade` alone.
if [[ "${SKIP_BUILD:-0}" != "1" ]]; then
  kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" rollout restart deploy -l "release=${RELEASE},tier=airflow" >/dev/null || true
  kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" rollout status deploy/"${RELEASE}-scheduler" --timeout=10m
fi

log "ready: flavour=${FLAVOUR} chart=${CHART_VERSION} image=${IMAGE}"
kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" get pods -o wide
cat <<MSG

api-server: http://127.0.0.1:8080   (REST API /api/v2, token from /auth/token)
run the scenarios:
  KIND_TESTS=1 KIND_FLAVOUR=${FLAVOUR} KUBECONFIG=\${KUBECONFIG:-\$HOME/.kube/config} pytest tests/kind -m kind -rs
MSG
