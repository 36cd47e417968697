#!/usr/bin/env bash
# Create (or reuse) the kind cluster and install Airflow HA with the stock or the fenced executor.
#
#   kind-config/up.sh fenced      # FencedKubernetesExecutor, helm-values/fenced-ha.yaml
#   kind-config/up.sh stock       # stock KubernetesExecutor, helm-values/stock-ha.yaml
#
# Idempotent: re-running with the other flavour rebuilds/loads the image and `helm upgrade`s the
# release in place. Use kind-config/down.sh to delete everything.
#
# What it installs is what CI renders (tests/helm): the chart source ../shared/helm/chart and the
# values file helm-values/<flavour>-ha.yaml, unchanged, plus generated secrets. After the install
# it asks the running scheduler which executor Airflow loaded and whether its service account may
# create pods, and fails if either is wrong.
#
# Overridable through the environment:
#   KIND_CLUSTER_NAME   (fenced-k8s)    AIRFLOW_NAMESPACE (airflow)   RELEASE (airflow)
#   CHART_DIR           (../shared/helm/chart, see step 5)
#   SKIP_BUILD=1        reuse an image already loaded into the cluster
#   HELM_TIMEOUT        (15m)
set -euo pipefail

KIND_CLUSTER_NAME="${KIND_CLUSTER_NAME:-fenced-k8s}"
AIRFLOW_NAMESPACE="${AIRFLOW_NAMESPACE:-airflow}"
RELEASE="${RELEASE:-airflow}"
HELM_TIMEOUT="${HELM_TIMEOUT:-15m}"
# Fixed: must equal images.airflow and images.pod_template in helm-values/*-ha.yaml, which are
# installed unchanged (tests/helm checks that the three agree).
IMAGE="fenced-k8s-executor:dev"

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
  log "building ${IMAGE} (the Dockerfile's kind stage; first the wheel its runtime stage copies)"
  (cd "${ROOT}" && python3 -m pip wheel --quiet --no-deps . -w dist)
  docker build --target kind -t "${IMAGE}" "${ROOT}"
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

# 4. Metadata database outside the chart, like production (kind-config/postgres.yaml).
log "metadata database (kind-config/postgres.yaml)"
kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" apply -f "${HERE}/postgres.yaml"
kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" rollout status deploy/airflow-metadata-db --timeout=5m

# 5. Chart. Default: the chart source CI renders (official apache/airflow chart, 1.20.0-dev).
# CHART_DIR may point at another unpacked chart, e.g.
#   helm pull apache-airflow/airflow --version X.Y.Z --untar -d /tmp/c && CHART_DIR=/tmp/c/airflow
# but CI has not rendered that one: see docs/helm.md ("Chart versions") first.
CHART_DIR="${CHART_DIR:-${ROOT}/../shared/helm/chart}"
[[ -f "${CHART_DIR}/Chart.yaml" ]] || {
  echo "up.sh: no chart at ${CHART_DIR} (set CHART_DIR to an unpacked apache-airflow chart)" >&2; exit 2; }
# The values turn the bundled postgresql subchart off, and the shared chart source does not ship
# it. helm refuses a chart whose Chart.yaml lists a dependency missing from charts/ even when its
# condition is off, so install a copy without that dependency entry (the same manifests).
CHART_COPY="${ROOT}/out/kind/chart"
rm -rf "${CHART_COPY}" && mkdir -p "${CHART_COPY}"
cp -R "${CHART_DIR}/." "${CHART_COPY}/" && chmod -R u+w "${CHART_COPY}"
if [[ ! -d "${CHART_COPY}/charts/postgresql" ]]; then
  awk '/^dependencies:/ {skip=1; next} skip && /^[^[:space:]-]/ {skip=0} !skip' \
    "${CHART_DIR}/Chart.yaml" > "${CHART_COPY}/Chart.yaml"
  rm -f "${CHART_COPY}/Chart.lock"
fi
CHART_VERSION="$(awk '/^version:/ {print $2; exit}' "${CHART_COPY}/Chart.yaml")"

log "helm upgrade --install ${RELEASE} (chart ${CHART_VERSION} from ${CHART_DIR}; ${VALUES##*/})"
# The pending-pressure quota (if left behind) would block the rollout.
kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" delete resourcequota fenced-repro-pod-pressure --ignore-not-found
"${HERE}/pending-pressure/taint.sh" release

helm upgrade --install "${RELEASE}" "${CHART_COPY}" \
  --kube-context "${CTX}" \
  --namespace "${AIRFLOW_NAMESPACE}" \
  --values "${VALUES}" \
  --values "${SECRETS_FILE}" \
  --wait --timeout "${HELM_TIMEOUT}"

# 6. Rollout
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


# 7. What the running scheduler really loads, and its pod RBAC (the CI render predicts both).
case "${FLAVOUR}" in
  fenced) WANT_EXECUTOR="fenced_k8s_executor.FencedKubernetesExecutor" ;;
  stock)  WANT_EXECUTOR="KubernetesExecutor" ;;
esac
GOT_EXECUTOR="$(kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" exec "deploy/${RELEASE}-scheduler" -c scheduler -- \
  airflow config get-value core executor 2>/dev/null | tail -n 1 || true)"
[[ "${GOT_EXECUTOR}" == "${WANT_EXECUTOR}" ]] || {
  echo "up.sh: the scheduler loads executor '${GOT_EXECUTOR}', expected '${WANT_EXECUTOR}'" >&2; exit 1; }
SCHEDULER_SA="$(kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" get "deploy/${RELEASE}-scheduler" \
  -o jsonpath='{.spec.template.spec.serviceAccountName}')"
for verb in create get list watch patch delete; do
  kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" auth can-i "${verb}" pods \
    --as "system:serviceaccount:${AIRFLOW_NAMESPACE}:${SCHEDULER_SA}" >/dev/null || {
    echo "up.sh: service account ${SCHEDULER_SA} may not ${verb} pods" >&2; exit 1; }
done

log "ready: flavour=${FLAVOUR} executor=${GOT_EXECUTOR} chart=${CHART_VERSION} image=${IMAGE}"
kubectl --context "${CTX}" -n "${AIRFLOW_NAMESPACE}" get pods -o wide
cat <<MSG

api-server: http://127.0.0.1:8080   (REST API /api/v2, token from /auth/token)
hold new worker pods Pending: kind-config/pending-pressure/taint.sh hold|release
tests/kind installs its own releases (airflow-stock, airflow-fenced; docs/kind.md section 2):
delete this one first (helm uninstall ${RELEASE} -n ${AIRFLOW_NAMESPACE}), both use NodePort 30007.
MSG
