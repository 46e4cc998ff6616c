"""``horovod.runner.common``: the parts of Horovod's runner utilities that other projects import
(Ray Train's Horovod backend: ``horovod.runner.common.util.secret`` and ``.timeout``)."""
