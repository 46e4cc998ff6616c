"""``horovod.tensorflow.util``: the helpers Horovod's own tests and integrations import."""
from __future__ import annotations

import tensorflow as tf

__all__ = ["_executing_eagerly", "vars_to_refs", "refs_to_vars"]


def _executing_eagerly() -> bool:
    """True when TensorFlow runs eagerly (not while tracing a ``tf.function`` or a TF1 graph)."""
    return tf.executing_eagerly()


def vars_to_refs(variables):  # noqa: ANN001, ANN201
    """Hashable references of variables (``var.ref()``), for sets and dict keys."""
    return [v.ref() for v in variables]


def refs_to_vars(refs):  # noqa: ANN001, ANN201
    return [r.deref() for r in refs]
