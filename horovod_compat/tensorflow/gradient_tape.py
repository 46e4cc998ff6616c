"""``hvd.DistributedGradientTape`` and ``hvd.PartialDistributedGradientTape``.

The wrapper is an instance of a subclass of the user's own tape class (``isinstance`` still holds)
that shares the recorded tape; ``gradient()`` computes the local gradients, then averages them
across ranks in one grouped allreduce (``gradients``).  Gradients of *local*
variables (``PartialDistributedGradientTape``'s ``local_layers``, or ``register_local_source``) are
not reduced (``gradients.reduce_gradients``)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from horovod_compat.common.ops import Average
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from .compression import Compression
from .gradients import LocalVariables, reduce_gradients

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class _DistributedGradientTape(tf.GradientTape):
    """Mixed in before the user's tape class (see ``DistributedGradientTape``)."""

    def _hvd_setup(self, compression: Any, sparse_as_dense: bool, op: int,
                   gradient_predivide_factor: float, process_set: ProcessSet,
                   scale_local_gradients: bool) -> None:
        self._hvd_compression = compression
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_op = op
        self._hvd_predivide = gradient_predivide_factor
        self._hvd_process_set = process_set
        self._hvd_scale_local = scale_local_gradients
        self._hvd_local = LocalVariables()

    def register_local_source(self, source: Any) -> None:
        """Keep the gradient of ``source`` (a variable or tensor) local: not reduced across ranks
        (Horovod's model-parallel API; ``PartialDistributedGradientTape`` uses it per layer)."""
        self._hvd_local.register(source)

    def _local_gradients(self, target: Any, sources: Any, output_gradients: Any = None,
                         **kwargs: Any) -> Any:
        return super().gradient(target, sources, output_gradients, **kwargs)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 **kwargs: Any) -> Any:
        grads = self._local_gradients(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._reduce(flat_sources, flat_grads)
        return tf.nest.pack_sequence_as(grads, reduced)

    def _is_local(self, source: Any) -> bool:
        return source in self._hvd_local

    def _reduce(self, flat_sources: Sequence[Any], flat_grads: Sequence[Any]) -> List[Any]:
        return reduce_gradients(flat_grads, flat_sources, self._hvd_local, self._hvd_scale_local,
                                op=self._hvd_op, compression=self._hvd_compression,
                                sparse_as_dense=self._hvd_sparse_as_dense,
                                gradient_predivide_factor=self._hvd_predivide,
                                process_set=self._hvd_process_set)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None
                                       ) -> Tuple[List[Tuple[Any, Any]], List[Tuple[Any, Any]]]:
        """``([(local var, its gradient)], [(global var, its reduced gradient)])``."""
        flat_sources = tf.nest.flatten(sources)
        grads = self.gradient(target, sources, output_gradients)
        flat_grads = tf.nest.flatten(grads)
        pairs = list(zip(flat_sources, flat_grads))
        return ([(v, g) for v, g in pairs if self._is_local(v)],
                [(v, g) for v, g in pairs if not self._is_local(v)])


_classes: Dict[type, type] = {}


def _wrap(gradtape: tf.GradientTape) -> _DistributedGradientTape:
    base = type(gradtape)
    if isinstance(gradtape, _DistributedGradientTape):
        return gradtape
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(base.__name__, (_DistributedGradientTape, base), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recorded tape, persistence, watches
    # ... but not the recording context: a tape wrapped inside its own ``with`` block
    # (``with tf.GradientTape() as tape: ...; tape = hvd.DistributedGradientTape(tape)``) is
    # stopped by that block's exit, on the original object; a wrapper that believed itself
    # recording would pop the same tape again in gradient(), which crashes TensorFlow (SIGSEGV).
    # Horovod's wrapper is likewise a tape of its own, not recording, that shares the recorded one.
    tape._recording = False
    return tape


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: int = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Optional[Any] = None,
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """A tape whose ``gradient()`` averages the gradients across ranks (Horovod's API;
    ``num_groups``/``groups`` are accepted: every gradient already travels in one group)."""
    if groups is not None and not (isinstance(groups, int) or isinstance(groups, list)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    tape = _wrap(gradtape)
    tape._hvd_setup(compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                    scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression: Any = Compression.none,
                                   sparse_as_dense: bool = False, op: int = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Optional[Any] = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Optional[Sequence[Any]] = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """``DistributedGradientTape`` that keeps the gradients of ``local_layers``' variables local."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    layers = [] if local_layers is None else (
        [local_layers] if not isinstance(local_layers, (list, tuple)) else list(local_layers))
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
