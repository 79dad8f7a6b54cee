"""`JobSparkSubmitOperator`: Airflow's SparkSubmitOperator for keyshift's jobs, on `local[*]` or a cluster.

The provider's operator runs `spark-submit` in the task process's working directory. On a cluster
master (`KEYSHIFT_SPARK_MASTER=spark://...`) the job ships its executors a packed environment and
sets `spark.pyspark.python = ./environment/bin/python` (`keyshift.stack.executor_env`), a path
relative to the working directory that the driver's own Python processes use too. This operator
runs `spark-submit` in a folder where that path names the task's venv
(`executor_env.driver_folder`), exactly as the supervisor of a continuous run does
(`keyshift.orchestration.launch`). On a local master it changes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class JobSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator whose `spark-submit` runs in a driver folder on a cluster master.

    Takes SparkSubmitOperator's arguments unchanged (`conn_id`, `application`, `jars`, `conf`,
    `application_args`, ...). The master is the one keyshift's settings name
    (`KEYSHIFT_SPARK_MASTER`, which the stack also puts in the `spark_default` connection,
    `keyshift.stack.airflow`); with a `local[...]` master `execute` is the provider's.

    Raises:
        Whatever SparkSubmitOperator raises (AirflowException when spark-submit fails).
    """

    def execute(self, context: Any) -> Any:
        """Run spark-submit (the provider's `execute`), in a driver folder on a cluster master."""
        from keyshift.settings import Settings
        from keyshift.stack.executor_env import driver_folder
        from keyshift.stack.spark import is_local_master

        settings = Settings()
        if is_local_master(settings.spark_master):
            return super().execute(context)
        folder = driver_folder()
        self.log.info("spark-submit runs in %s: its environment/ is this venv, as the executors' is the shipped one", folder)
        previous = os.getcwd()
        os.chdir(folder)  # the task runs in a process of its own; the provider's Popen takes its cwd
        try:
            return super().execute(context)
        finally:
            os.chdir(previous)
