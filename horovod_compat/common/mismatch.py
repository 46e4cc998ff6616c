"""Horovod's "Mismatched ..." errors: the ranks submitted one collective with different shapes,
dtypes, reduce ops, root ranks, scale factors, tensor counts, kinds or devices.  Every such message
is written here, for every binding, process set and transport.

A message is Horovod's own first sentence, word for word (scripts and Horovod's tests match on it),
followed by what Horovod leaves out: the op's name and which ranks sent what, e.g.::

    Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [3], but another rank sent
    a tensor of shape [4]. Tensor 'metric': ranks 0, 2 sent shape [3]; rank 1 sent shape [4].

The validators (``collectives``, ``negotiation``) see every rank's descriptor of the op and build a
``Mismatch`` from every rank's value; the coordinator adds the op's name (for an unnamed op every
rank's automatic name, gathered on this slow path only) and the ranks' global numbers, so every rank
raises the same text.  The torch binding's checks before its fused broadcasts and the
DistributedOptimizer's buckets (which gather every rank's layout) use the same messages.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["Mismatch", "differ", "count", "reduce_op", "dtype", "shape", "root_rank", "scale",
           "gather_rank", "gather_dim", "kind", "device"]

#: At most this many ranks are listed for one value, and this many values for one op.
_RANKS_SHOWN = 4
_VALUES_SHOWN = 4


class Mismatch:
    """Ranks disagree on one collective.  ``values``: every rank's value (by index in the process
    set, None for a rank that joined); ``phrase``: how a rank's value reads, e.g. ``"sent shape
    {}"``; ``tensor``: the index of the tensor concerned in a grouped op, None when the whole op
    is concerned."""

    __slots__ = ("headline", "phrase", "values", "tensor")

    def __init__(self, headline: str, phrase: str, values: Sequence[Optional[str]],
                 tensor: Optional[int] = None) -> None:
        self.headline = headline
        self.phrase = phrase
        self.values = list(values)
        self.tensor = tensor

    def text(self, kind: str, tensors: int, name: str,
             auto_names: Optional[Sequence[Optional[str]]], ranks: Sequence[int]) -> str:
        """The error every rank raises.  ``kind``, ``tensors``: the op's kind and tensor count (as
        the first rank that did not join submitted it); ``name``: its user-given name ("" when
        unnamed); ``auto_names``: for an unnamed op, every rank's automatic name (by set index,
        None for a rank that joined); ``ranks``: the set's global ranks."""
        return self.describe(_subject(kind, tensors, name, auto_names, ranks, self.tensor), ranks)

    def describe(self, subject: str, ranks: Sequence[int]) -> str:
        """The error about ``subject`` (e.g. ``Tensor 'metric'``); ``ranks``: the global ranks,
        in the order of ``values``."""
        return f"{self.headline} {subject}: {_who(self.values, ranks, self.phrase)}."


def differ(values: Sequence[Optional[object]]) -> bool:
    """Whether the ranks that did not join (non-None values) disagree."""
    first = next(v for v in values if v is not None)
    return any(v is not None and v != first for v in values)


def _pair(values: Sequence[Optional[str]]) -> Tuple[str, str]:
    """Horovod's "one rank" and "another rank": the first rank's value and the first different."""
    a = next(v for v in values if v is not None)
    return a, next(v for v in values if v is not None and v != a)


def _ranks(rs: Sequence[int]) -> str:
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if len(rs) <= _RANKS_SHOWN + 1:  # "and 1 more" would say no less
        return "ranks " + ", ".join(str(r) for r in rs)
    shown = ", ".join(str(r) for r in rs[:_RANKS_SHOWN])
    return f"ranks {shown} and {len(rs) - _RANKS_SHOWN} more"


def _groups(values: Sequence[Optional[str]], ranks: Sequence[int]) -> List[Tuple[str, List[int]]]:
    """The ranks grouped by value, in the order the values first appear; joined ranks (None) left
    out."""
    by_value: Dict[str, List[int]] = {}
    for r, v in zip(ranks, values):
        if v is not None:
            by_value.setdefault(v, []).append(r)
    return list(by_value.items())


def _listed(parts: List[str], rest: List[Tuple[str, List[int]]]) -> str:
    if rest:
        n = sum(len(rs) for _v, rs in rest)
        parts.append(f"{n} more rank{'s' if n > 1 else ''} with {len(rest)} other "
                     f"value{'s' if len(rest) > 1 else ''}")
    return "; ".join(parts)


def _who(values: Sequence[Optional[str]], ranks: Sequence[int], phrase: str) -> str:
    """``ranks 0, 2 sent shape [3]; rank 1 sent shape [4]``, then the ranks that joined."""
    groups = _groups(values, ranks)
    text = _listed([f"{_ranks(rs)} {phrase.format(v)}" for v, rs in groups[:_VALUES_SHOWN]],
                   groups[_VALUES_SHOWN:])
    joined = [r for r, v in zip(ranks, values) if v is None]
    return text + (f"; {_ranks(joined)} had called hvd.join()" if joined else "")


def _subject(kind: str, tensors: int, name: str, auto_names: Optional[Sequence[Optional[str]]],
             ranks: Sequence[int], tensor: Optional[int]) -> str:
    """``Tensor 'metric'``, ``Grouped ALLREDUCE 'grads', tensor index 1 of 3``,
    ``Unnamed tensor (automatic name 'allreduce.noname.4')``, ..."""
    grouped = kind.startswith("grouped_")
    noun = (f"grouped {kind[len('grouped_'):].upper()}" if grouped
            else "barrier" if kind == "barrier" else "tensor")
    if name:
        out = f"{noun[0].upper()}{noun[1:]} {name!r}"
    else:
        groups = _groups(auto_names or [], ranks)
        if len(groups) == 1:
            out = f"Unnamed {noun} (automatic name {groups[0][0]!r})"
        elif groups:  # ranks that diverged earlier number their unnamed ops differently
            auto = _listed([f"{v!r} on {_ranks(rs)}" for v, rs in groups[:_VALUES_SHOWN]],
                           groups[_VALUES_SHOWN:])
            out = f"Unnamed {noun} (automatic name {auto})"
        else:
            out = f"Unnamed {noun}"
    if grouped and tensor is not None:
        out += f", tensor index {tensor} of {tensors}"
    return out


# ----------------------------------------------------------------------------- the messages
# Horovod's first sentences (word for word), each with how one rank's value reads after it.

def count(kind: str, values: Sequence[Optional[str]]) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched number of tensors in grouped {kind}: One rank sent {a} tensors, "
                    f"but another rank sent {b} tensors.", "sent {}",
                    [None if v is None else f"{v} tensor" if v == "1" else f"{v} tensors"
                     for v in values])


def reduce_op(kind: str, values: Sequence[Optional[str]]) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched {kind} reduction operations: One rank did {a}, but another rank "
                    f"did {b}.", "did {}", values)


def dtype(values: Sequence[Optional[str]], tensor: Optional[int] = None) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched data types: One rank had type {a}, but another rank had type "
                    f"{b}.", "had type {}", values, tensor)


def shape(kind: str, values: Sequence[Optional[str]], tensor: Optional[int] = None) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched {kind} tensor shapes: One rank sent a tensor of shape {a}, but "
                    f"another rank sent a tensor of shape {b}.", "sent shape {}", values, tensor)


def root_rank(values: Sequence[Optional[str]]) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched BROADCAST root ranks: One rank specified root rank {a}, but "
                    f"another rank specified root rank {b}.", "specified root rank {}", values)


def scale(values: Sequence[Optional[str]]) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched prescale and/or postscale factors: One rank sent factors {a}, "
                    f"but another rank sent factors {b}.", "sent factors {}", values)


def gather_rank(values: Sequence[Optional[str]], shapes: Sequence[Optional[str]],
                tensor: Optional[int] = None) -> Mismatch:
    """The number of dimensions (``values``) of an allgather's tensor differs; ``shapes``: every
    rank's shape, what the ranks are listed with."""
    a, b = _pair(values)
    return Mismatch(f"Mismatched ALLGATHER tensor shapes: One rank sent a tensor of rank {a}, but "
                    f"another rank sent a tensor of rank {b}.", "sent shape {}", shapes, tensor)


def gather_dim(dim: int, values: Sequence[Optional[str]], shapes: Sequence[Optional[str]],
               tensor: Optional[int] = None) -> Mismatch:
    """Dimension ``dim`` (not the first: allgather concatenates along it) of an allgather's
    tensor differs (``values``); ``shapes``: every rank's shape, what the ranks are listed with."""
    a, b = _pair(values)
    return Mismatch(f"Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension "
                    f"{dim} equal to {a}, but another rank sent a tensor with dimension {dim} "
                    f"equal to {b}.", "sent shape {}", shapes, tensor)


def kind(values: Sequence[Optional[str]]) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched collective operations: One rank did an {a}, but another rank "
                    f"did an {b}.", "did an {}", values)


def device(values: Sequence[Optional[str]]) -> Mismatch:
    a, b = _pair(values)
    return Mismatch(f"Mismatched device types: One rank had a tensor on {a}, but another rank "
                    f"had a tensor on {b}.", "had a tensor on {}", values)
