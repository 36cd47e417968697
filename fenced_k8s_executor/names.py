"""Names shared by the executor, the sweep, the launch gate, the lab and the deployment files.

Kept in one dependency-free module so that every consumer (including Helm values and docs
checks) agrees on the exact strings.
"""

from __future__ import annotations

#: Distribution and import names.
DISTRIBUTION = "fenced-k8s-executor"
EXECUTOR_CLASS_PATH = "fenced_k8s_executor.FencedKubernetesExecutor"

#: Airflow configuration section owned by this package.
CONFIG_SECTION = "fenced_kubernetes_executor"

#: Pod metadata carrying the launch identity.
_PREFIX = "fenced-k8s-executor.io/"
TI_ID_ANNOTATION = _PREFIX + "ti-id"
TOKEN_ANNOTATION = _PREFIX + "launch-token"
TRY_NUMBER_ANNOTATION = _PREFIX + "try-number"
SCHEDULER_JOB_ANNOTATION = _PREFIX + "scheduler-job-id"
#: Airflow 3.4: the dynamic region of a task inside one (absent outside any, and before 3.4).
REGION_ANNOTATION = _PREFIX + "region-id"
TOKEN_LABEL = _PREFIX + "launch-token"
TI_ID_LABEL = _PREFIX + "ti-id"
#: Which Airflow deployment (metadata DB) launched the pod: the fences only ever delete their own.
DEPLOYMENT_ANNOTATION = _PREFIX + "deployment"
DEPLOYMENT_LABEL = _PREFIX + "deployment"
#: The launching scheduler's SchedulerJob start_date (ISO 8601, UTC): with the job id, which
#: scheduler process launched the pod (job ids repeat across copies of a database, starts do not).
SCHEDULER_STARTED_ANNOTATION = _PREFIX + "scheduler-started"
#: The witness Lease's annotations, one per scheduler process: ``job.<job id>.<start>``.
WITNESS_ENTRY_PREFIX = _PREFIX + "job."

#: Extra claim minted into the workload JWT (the launch gate).
LAUNCH_CLAIM = "fenced_launch"

#: Metric namespace (emitted through airflow Stats).
METRIC_PREFIX = "fenced_k8s_executor"
