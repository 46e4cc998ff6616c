"""Serialising the user's function for the ranks, with errors that name what cannot be pickled.

Functions are pickled by value (cloudpickle) when their module is the user's own code, not an
installed library: a rank may not be able to import a notebook, `__main__` or a test file, and it
must run exactly the code the driver has.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
import sysconfig
import types
import warnings
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import cloudpickle

from .errors import PayloadPicklingError
from .spec import CommandTarget, FunctionTarget, ScriptTarget, Target

_ADVICE = (
    "Create such objects inside the training function instead (import modules and build models, "
    "data loaders, locks, sessions or open files there), so that each rank makes its own."
)


def dumps_target(target: Target) -> bytes:
    """The PAYLOAD a rank receives for any kind of target."""
    if isinstance(target, FunctionTarget):
        return dumps_function(target.fn, tuple(target.args), dict(target.kwargs))
    if isinstance(target, ScriptTarget):
        return dumps_script(target.path, target.argv)
    assert isinstance(target, CommandTarget)
    return dumps_command(target.argv)


#: Above this many bytes a function payload draws a warning (HorovodRunner's threshold): every
#: rank receives its own copy.
LARGE_PAYLOAD_BYTES = 10 * 1024 * 1024


def warn_if_large(target: Target, data: bytes) -> None:
    """Warn, naming the largest pieces, when a function target pickles to more than
    ``LARGE_PAYLOAD_BYTES`` (a captured dataset or model travels to every rank)."""
    if not isinstance(target, FunctionTarget) or len(data) <= LARGE_PAYLOAD_BYTES:
        return
    largest = ", ".join(f"{name} ({n / 2**20:.1f} MB)" for name, n in
                        pickled_size_report(target.fn, tuple(target.args), dict(target.kwargs)))
    warnings.warn(
        f"The pickled training function {target.description!r} and its arguments take "
        f"{len(data) / 2**20:.1f} MB (largest: {largest}). Every rank receives a copy; load large "
        "data inside the function (e.g. from a file path you pass) instead of capturing it.",
        UserWarning,
        stacklevel=2,
    )


def dumps_function(fn: Any, args: tuple, kwargs: dict) -> bytes:
    """Pickle a function call for the ranks, or raise `PayloadPicklingError` naming the culprit."""
    try:
        with _by_value(fn, *args, *kwargs.values()):
            return cloudpickle.dumps(("function", fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets the same diagnosis
        culprit = _find_unpicklable(fn, args, kwargs)
        where = f" {culprit[0]} ({type(culprit[1]).__name__})" if culprit else " an object"
        raise PayloadPicklingError(
            f"Cannot pickle the training function {getattr(fn, '__qualname__', fn)!r}: it refers "
            f"to{where} that cannot be pickled ({type(exc).__name__}: {exc}). {_ADVICE}"
        ) from exc


def dumps_script(path: str, argv: Sequence[str]) -> bytes:
    """Pickle a script run for the ranks."""
    return cloudpickle.dumps(("script", os.path.abspath(path), list(argv)))


def dumps_command(argv: Sequence[str]) -> bytes:
    """Pickle a command run for the ranks."""
    return cloudpickle.dumps(("command", list(argv)))


def dumps_value(value: Any, what: str) -> bytes:
    """Pickle a return value in a rank, with an error that says which value failed."""
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001
        raise PayloadPicklingError(
            f"{what} of type {type(value).__name__} cannot be pickled "
            f"({type(exc).__name__}: {exc}). Return plain data (numbers, lists, dicts, tensors, "
            "a state_dict) instead."
        ) from exc


def pickled_size_report(fn: Any, args: tuple, kwargs: dict, top: int = 5) -> List[Tuple[str, int]]:
    """The largest pickled pieces of a payload as (description, bytes), largest first."""
    sizes: List[Tuple[str, int]] = []
    for label, obj in _pieces(fn, args, kwargs):
        with contextlib.suppress(Exception), _by_value(fn, *args, *kwargs.values()):
            sizes.append((label, len(cloudpickle.dumps(obj))))
    return sorted(sizes, key=lambda item: -item[1])[:top]


def _pieces(fn: Any, args: tuple, kwargs: dict) -> Iterator[Tuple[str, Any]]:
    for i, arg in enumerate(args):
        yield f"positional argument {i}", arg
    for key, value in kwargs.items():
        yield f"argument {key!r}", value
    if isinstance(fn, types.FunctionType):
        closure = inspect.getclosurevars(fn)
        for name, value in {**closure.globals, **closure.nonlocals}.items():
            if not isinstance(value, types.ModuleType):
                yield f"global {name!r}", value
    elif not isinstance(fn, (types.BuiltinFunctionType, type)):
        yield "the callable object", fn


def _find_unpicklable(fn: Any, args: tuple, kwargs: dict) -> Optional[Tuple[str, Any]]:
    for label, obj in _pieces(fn, args, kwargs):
        try:
            with _by_value(fn, *args, *kwargs.values()):
                cloudpickle.dumps(obj)
        except Exception:  # noqa: BLE001
            return label, obj
    return None


_OWN_PACKAGES = frozenset({"distributor", "horovod_compat", "horovod", "sparkdl"})


def _installed_prefixes() -> Tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(os.path.realpath(p) + os.sep for p in roots if p)


def _is_user_module(module: types.ModuleType) -> bool:
    path = getattr(module, "__file__", None)
    if not path or module.__name__ == "__main__":
        return False  # cloudpickle already pickles __main__ by value
    if module.__name__.split(".")[0] in _OWN_PACKAGES:
        return False  # every rank imports this project itself
    return not os.path.realpath(path).startswith(_installed_prefixes())


@contextlib.contextmanager
def _by_value(fn: Any, *more: Any) -> Iterator[None]:
    """Pickle by value the user modules of `fn` and of any function among `more` (the call's
    arguments: a front end may wrap the user's function and pass it as an argument)."""
    registered = []
    for obj in (fn, *more):
        if obj is not fn and not isinstance(obj, types.FunctionType):
            continue
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if module is None or module in registered or not _is_user_module(module):
            continue
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:
            continue
        registered.append(module)
    try:
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)
