"""``horovod.spark``: Horovod's Spark APIs on this project's engine."""
