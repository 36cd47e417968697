"""The lab's DAG: a fan-out whose tasks never fail by themselves, unless told to.

So every failed try is the executor's or HA's doing (a burned retry), and every task print
names the pod that ran its code (``LAB-TASK-RAN <pod> <try>``), which tells stale task runs
apart. With ``fail_first`` each task fails its first try on purpose and says so
(``LAB-TASK-FAILED <pod> <try>``): those failures, and the retries they use, are the task's own.
"""

from __future__ import annotations

from pathlib import Path

TASK_MARK = "LAB-TASK-RAN"
FAIL_MARK = "LAB-TASK-FAILED"

FANOUT_DAG = '''
import os
import time

import pendulum
from airflow.sdk import dag, get_current_context, task

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False,
     max_active_tasks={width}, default_args={{"retries": {retries}, "retry_delay": pendulum.duration(seconds=2)}})
def fanout():
    @task
    def work(i: int):
        try_number = get_current_context()["ti"].try_number
        print("{mark}", os.environ.get("HOSTNAME"), try_number, flush=True)
        time.sleep({seconds})
        if {fail_first} and try_number == 1:
            print("{fail_mark}", os.environ.get("HOSTNAME"), try_number, flush=True)
            raise RuntimeError("lab: deliberate first-try failure")
        return i

    for i in range({width}):
        work.override(task_id=f"t{{i:02d}}")(i)

fanout()
'''


def write_fanout(folder: Path, dag_id: str, width: int, retries: int = 2, seconds: float = 1.0,
                 fail_first: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dag_id}.py"
    path.write_text(FANOUT_DAG.format(dag_id=dag_id, width=width, retries=retries, seconds=seconds, mark=TASK_MARK,
                                      fail_mark=FAIL_MARK, fail_first=bool(fail_first)))
    return path
