"""The PAYLOAD format: the user's target serialised for the ranks, with errors that name what
cannot be pickled, and its loading on the rank (`loads_target`).

Functions are pickled by value (cloudpickle) when their module is the user's own code, not an
installed library: a rank may not be able to import a notebook, `__main__` or a test file, and it
must run exactly the code the driver has.

A rank's traceback must still name the user's file and line and show the source line. So code
objects travel whole, as `marshal` writes them (file name, line table and positions included;
cloudpickle 3.1.3 and later write "<dynamic-code>" as every file name), and a function payload
carries the source text of the user files its code comes from: the rank puts it in `linecache`
before it unpickles the call, so a notebook cell or a file the rank cannot read shows its lines.

A function payload is ``pickle(("function", call, sources))``: ``call`` the pickled
``(fn, args, kwargs)``, ``sources`` ``{file name: lines}``. Script and command payloads are
``("script", path, argv)`` and ``("command", argv)``.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import linecache
import marshal
import os
import pickle
import sys
import sysconfig
import types
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

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
            buffer = io.BytesIO()
            pickler = _CodeKeepingPickler(buffer)
            pickler.dump((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets the same diagnosis
        culprit = _find_unpicklable(fn, args, kwargs)
        where = f" {culprit[0]} ({type(culprit[1]).__name__})" if culprit else " an object"
        raise PayloadPicklingError(
            f"Cannot pickle the training function {getattr(fn, '__qualname__', fn)!r}: it refers "
            f"to{where} that cannot be pickled ({type(exc).__name__}: {exc}). {_ADVICE}"
        ) from exc
    sources = source_texts(pickler.code_files)
    return pickle.dumps(("function", buffer.getvalue(), sources), protocol=pickle.HIGHEST_PROTOCOL)


def dumps_script(path: str, argv: Sequence[str]) -> bytes:
    """Pickle a script run for the ranks."""
    return cloudpickle.dumps(("script", os.path.abspath(path), list(argv)))


def dumps_command(argv: Sequence[str]) -> bytes:
    """Pickle a command run for the ranks."""
    return cloudpickle.dumps(("command", list(argv)))


def loads_target(data: bytes) -> tuple:
    """The target a PAYLOAD carries, on the rank: ``("function", fn, args, kwargs)``,
    ``("script", path, argv)`` or ``("command", argv)``. A function's source texts are put in
    `linecache` before the call is unpickled, so that even a failure while unpickling it shows
    the user's lines."""
    target = pickle.loads(data)
    if target[0] != "function":
        return target
    _, call, sources = target
    restore_sources(sources)
    fn, args, kwargs = pickle.loads(call)
    return "function", fn, args, kwargs


#: At most this many bytes of source text travel with one function payload; files past it are
#: left out (their tracebacks still name file and line, and show the line where the rank can
#: read the file).
SOURCE_BUDGET_BYTES = 4 * 1024 * 1024


class _CodeKeepingPickler(cloudpickle.Pickler):
    """cloudpickle's pickler, except that each code object travels as `marshal` writes it: whole,
    with its real file name, on every cloudpickle. It records the file names it met."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.code_files: Set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            try:
                data = marshal.dumps(obj)
            except ValueError:  # not marshallable: cloudpickle's own reduction (file name lost)
                return super().reducer_override(obj)
            self.code_files.update(_file_names(obj))
            return marshal.loads, (data,)
        return super().reducer_override(obj)


def _file_names(code: types.CodeType) -> Iterator[str]:
    """The file names of `code` and of the code objects nested in it (functions, lambdas,
    comprehensions and classes defined inside it)."""
    yield code.co_filename
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _file_names(const)


def source_texts(files: Iterable[str]) -> Dict[str, List[str]]:
    """``{file name: lines}`` of the user's files among `files`, as the driver's `linecache`
    knows them: a file on disk, or a notebook cell that IPython registered there. Files of
    installed packages and of this project are left out (every rank has the same installation;
    a wrapper a front end defines inside a function travels by value too)."""
    installed = _installed_prefixes() + _OWN_PREFIXES
    sources: Dict[str, List[str]] = {}
    budget = SOURCE_BUDGET_BYTES
    for name in sorted(files):
        if os.path.isabs(name) and os.path.realpath(name).startswith(installed):
            continue
        lines = linecache.getlines(name)
        size = sum(map(len, lines))
        if lines and size <= budget:
            sources[name] = list(lines)
            budget -= size
    return sources


def restore_sources(sources: Dict[str, List[str]]) -> None:
    """Put the driver's source texts in this process's `linecache`. Without a modification time
    an entry is never checked against the disk, so the lines shown are those of the code that
    runs, even where the rank has another copy of the file."""
    for name, lines in sources.items():
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)


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
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_OWN_PREFIXES = tuple(os.path.join(_PROJECT_ROOT, name) + os.sep for name in sorted(_OWN_PACKAGES))


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
    arguments: a front end may wrap the user's function and pass it as an argument). A module the
    caller registered itself (``cloudpickle.register_pickle_by_value``) stays registered after."""
    registered = []
    already = cloudpickle.list_registry_pickle_by_value()
    for obj in (fn, *more):
        if obj is not fn and not isinstance(obj, types.FunctionType):
            continue
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if module is None or module in registered or module.__name__ in already \
                or not _is_user_module(module):
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
