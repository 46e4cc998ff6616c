"""``hvd.DistributedOptimizer(tf.compat.v1 optimizer, op=hvd.Adasum)``: Horovod's delta optimizer.

With Adasum the ranks do not combine gradients.  Each rank applies the wrapped optimizer's step with
its own gradients; then the change of every variable since the last combination (its *delta*) is
combined across the ranks with the Adasum rule, and every rank sets the variable to its value before
those steps plus the combined delta:

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

per tensor, over a binary tree of ranks -- the runtime's Adasum (``op=Adasum`` of one grouped
allreduce of the deltas: one round trip per step).  With ``backward_passes_per_step=N`` the ranks
take N local steps and combine the delta of all N at the N-th, as Horovod's Adasum optimizer does.
The number of ranks must be a power of two (Horovod's CPU restriction).

Works eagerly, in a ``tf.function`` and in a TF1 graph (the returned op runs the whole step).  With
N > 1 the optimizer keeps a step counter and one start value per variable (``tf.Variable``s made on
first use); whether a step combines is decided inside the collective's node, so the node keeps its
place among the function's collectives on every step.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from horovod_compat.common.ops import Adasum
from horovod_compat.common.process_sets import ProcessSet

from .mpi_ops import _check_adasum, _reduce_np

__all__ = ["DeltaReducer"]


def _read(var: Any) -> tf.Tensor:
    """The variable's current value (a fresh read, ordered after the enclosing dependencies)."""
    return tf.convert_to_tensor(var)


def _deps(*results: Any) -> List[Any]:
    """What to order later ops after: graph ops and tensors (nothing eagerly)."""
    if tf.executing_eagerly():
        return []
    out: List[Any] = []
    for r in results:
        for x in tf.nest.flatten(r):
            if isinstance(x, (tf.Operation, tf.Tensor)):
                out.append(x)
            elif isinstance(x, tf.Variable):
                out.append(x.op if hasattr(x, "op") else x)
    return out


class DeltaReducer:
    """Local optimizer steps whose weight deltas are combined with Adasum every ``passes`` steps."""

    def __init__(self, passes: int, compression: Any, process_set: ProcessSet) -> None:
        self.passes = int(passes)
        if self.passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.compression = compression
        self.process_set = process_set
        self.counter: Optional[tf.Variable] = None   # local steps taken (passes > 1)
        self._starts: Dict[int, tf.Variable] = {}     # id(variable) -> its value at the cycle start
        self._keep: List[Any] = []                    # keeps the keyed variables alive

    def _state(self, variables: Sequence[Any]) -> List[tf.Variable]:
        with tf.init_scope():
            if self.counter is None:
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="adasum_step_count")
            starts = []
            for v in variables:
                s = self._starts.get(id(v))
                if s is None:
                    s = tf.Variable(tf.zeros(tf.TensorShape(v.shape).as_list(), dtype=v.dtype),
                                    trainable=False, name="adasum_delta_start")
                    self._starts[id(v)] = s
                    self._keep.append(v)
                starts.append(s)
        return starts

    def _combine(self, deltas: List[tf.Tensor], when: Optional[tf.Tensor]) -> List[tf.Tensor]:
        pairs = [self.compression.compress(d) for d in deltas]
        combined = _reduce_np([p[0] for p in pairs], Adasum, 1.0, 1.0, None, self.process_set,
                              when=when)
        return [self.compression.decompress(c, p[1]) for c, p in zip(combined, pairs)]

    def step(self, variables: Sequence[Any], local_step: Callable[[], Any]) -> Any:
        """Run ``local_step()`` (the wrapped optimizer's update of ``variables``), then replace
        each variable's delta by the Adasum of every rank's.  Returns, in a graph, the op that runs
        all of it; eagerly, what ``local_step`` returned."""
        variables = list(variables)
        if not variables or not self.process_set.included():
            return local_step()
        _check_adasum(self.process_set)
        if self.passes == 1:
            starts = [_read(v) for v in variables]
            with tf.control_dependencies(starts):
                update = local_step()
            when = None
            after = _deps(update)
        else:
            start_vars = self._state(variables)
            counter = self.counter
            begin = tf.equal(tf.math.floormod(counter.read_value(), self.passes), 0)
            resets = [s.assign(tf.where(begin, _read(v), s.read_value()))
                      for s, v in zip(start_vars, variables)]
            with tf.control_dependencies(_deps(resets)):
                update = local_step()
            with tf.control_dependencies(_deps(update)):
                count = tf.convert_to_tensor(counter.assign_add(1))
            when = tf.equal(tf.math.floormod(count, self.passes), 0)
            after = _deps(update, count)
            with tf.control_dependencies(after):
                starts = [s.read_value() for s in start_vars]
        with tf.control_dependencies(after):
            current = [_read(v) for v in variables]
        combined = self._combine([c - s for c, s in zip(current, starts)], when)
        assigns = []
        for v, s, c, cur in zip(variables, starts, combined, current):
            new = s + c
            if when is not None:  # between combinations the local step stands
                new = tf.where(when, new, cur)
            assigns.append(v.assign(new))
        if tf.executing_eagerly():
            return update
        return tf.group(*_deps(assigns, update))
