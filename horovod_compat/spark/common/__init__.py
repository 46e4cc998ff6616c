"""``horovod.spark.common``: the Store and Backend the Spark estimators share."""
