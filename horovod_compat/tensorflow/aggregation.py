"""``backward_passes_per_step``: gradients accumulated locally over N passes and reduced once, for
Keras optimizers (``horovod_compat._keras``) and ``tf.compat.v1`` optimizers (``optimizer``) alike.

Each variable's gradient is added to an accumulator variable and a pass counter counts; on the N-th
pass the accumulated sums (divided by N with ``average_aggregated_gradients``) are reduced, the
accumulators and counter reset, and ``should_apply()`` is true: the optimizer applies the reduced
gradients then, and only then (on the other passes it applies nothing).  Works eagerly, in a
``tf.function`` and in a TF1 graph (``tf.cond``; the variables are made outside any function)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import tensorflow as tf

__all__ = ["LocalGradientAggregationHelper"]

_not_converted = tf.autograph.experimental.do_not_convert


def _shape_of(var: Any) -> List[int]:
    return [int(d) for d in tf.TensorShape(var.shape).as_list()]


class LocalGradientAggregationHelper:
    """``backward_passes_per_step``: per-variable accumulators and the pass ``counter``
    (``tf.Variable``s outside the optimizer's own variables, so checkpoints keep their layout)."""

    def __init__(self, backward_passes_per_step: int, average_aggregated_gradients: bool,
                 on_new_variable: Optional[Callable[[tf.Variable], None]] = None) -> None:
        """``on_new_variable(v)`` is called for each variable made (e.g. to initialize it in a
        session that only initializes the variables it knows: Keras' in a TF1 graph)."""
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        self._on_new_variable = on_new_variable
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False,
                                       name="hvd_aggregation_counter")
        self._made(self.counter)
        self._accumulators: Dict[int, Any] = {}
        self._keep: List[Any] = []  # keeps the keyed variables alive (ids stay unique)

    def _accumulator(self, var: Any, grad: tf.Tensor) -> tf.Variable:
        key = id(var)
        acc = self._accumulators.get(key)
        if acc is None:
            with tf.init_scope():
                acc = tf.Variable(tf.zeros(_shape_of(var), dtype=grad.dtype), trainable=False,
                                  name="hvd_aggregated_gradient")
            self._accumulators[key] = acc
            self._keep.append(var)
            self._made(acc)
        return acc

    def _made(self, variable: tf.Variable) -> None:
        if self._on_new_variable is not None:
            self._on_new_variable(variable)

    @_not_converted
    def aggregate(self, grads: Sequence[Any], variables: Sequence[Any],
                  reduce_fn: Callable[[List[Any], List[Any]], List[Any]]) -> List[Any]:
        """Add ``grads`` to the accumulators; on the N-th pass return the reduced accumulation
        (and reset), otherwise this pass's local gradients (which will not be applied)."""
        idx = [i for i, g in enumerate(grads) if g is not None]
        out: List[Any] = list(grads)
        if not idx:
            return out
        dense = [tf.convert_to_tensor(grads[i]) for i in idx]
        accs = [self._accumulator(variables[i], g) for i, g in zip(idx, dense)]
        adds = [a.assign_add(g) for a, g in zip(accs, dense)]
        with tf.control_dependencies(adds):
            count = self.counter.assign_add(1)
        n = self.backward_passes_per_step

        def boundary() -> List[tf.Tensor]:
            with tf.control_dependencies([count]):
                values = [a.read_value() for a in accs]
            if self.average_aggregated_gradients:
                values = [v / tf.cast(n, v.dtype) for v in values]
            reduced = [tf.convert_to_tensor(r) for r in
                       reduce_fn(values, [variables[i] for i in idx])]
            with tf.control_dependencies(reduced):
                resets = [a.assign(tf.zeros_like(a)) for a in accs]
                resets.append(self.counter.assign(0))
            with tf.control_dependencies(resets):
                return [tf.identity(r) for r in reduced]

        def between() -> List[tf.Tensor]:
            return [tf.identity(g) for g in dense]

        results = tf.cond(tf.equal(count, n), boundary, between)
        if not isinstance(results, (list, tuple)):
            results = [results]
        for i, r, g in zip(idx, results, dense):
            r.set_shape(g.shape)
            out[i] = r
        return out

    def gated(self, apply_fn: Callable[[], Any], grads: Sequence[Any],
              skip_fn: Optional[Callable[[], Any]] = None) -> tf.Tensor:
        """Run ``apply_fn`` on the passes that reduced (``grads``: this pass's ``aggregate``
        results), ``skip_fn`` (if any) on the others.  Returns whether it applied: the tensor a
        TF1 graph must run (it runs only what is fetched; a ``tf.function`` runs every stateful
        op anyway)."""
        def branch(fn: Optional[Callable[[], Any]], value: bool) -> Callable[[], tf.Tensor]:
            def run() -> tf.Tensor:
                done = fn() if fn is not None else None
                with tf.control_dependencies([done] if done is not None else []):
                    return tf.constant(value)
            return run

        return tf.cond(self.should_apply(after=grads), branch(apply_fn, True),
                       branch(skip_fn, False))

    def should_apply(self, after: Sequence[Any] = ()) -> tf.Tensor:
        """True right after a reduction (the counter went back to 0), read after ``after`` (this
        pass's ``aggregate`` results: a TF1 graph has no automatic control dependencies, and read
        before them the counter would say the previous pass's)."""
        deps = [g.values if isinstance(g, tf.IndexedSlices) else g for g in after]
        with tf.control_dependencies([d for d in deps if d is not None]):
            return tf.equal(self.counter.read_value(), 0)
