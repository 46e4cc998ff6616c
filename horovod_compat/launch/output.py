"""Where the ranks' output goes on the driver, as Horovod's launchers offer it: every line with
Horovod's prefix, chosen streams, timestamped lines (``prefix_output_with_timestamp``) and one
folder per rank (``--output-filename DIR`` → ``DIR/rank.<rank>/stdout`` and ``.../stderr``, the
rank zero-padded so that the folders sort in rank order).

Each line is printed as Horovod's gloo launcher printed it (``safe_shell_exec.prefix_connection``
in Horovod 0.28.1): ``[<rank>]<stdout>:<line>`` or ``[<rank>]<stderr>:<line>``, no space after the
colon; with timestamps ``time.asctime()`` goes right before it: ``Mon Jun  5 10:00:00 2023[1]<stdout>:...``.
Lines of the launcher itself (mpirun's, ssh's) read ``[launcher]<stderr>:...``. The engine has
already taken off the ``[rankN]: `` that torch's exception hook puts before a rank's traceback.

Tracebacks a rank prints on stderr are shown for the user's code (unless ``verbose``):

* frames of horovod-compat's own code are folded into one line ``  ... (N frames in horovod_compat)``;
* the traceback of an error that is the knock-on of another rank's failure (a peer that left or
  died during a collective, as `distributor.engine.is_knock_on` decides) is one line: the
  exception's line and where its full traceback is;
* the C++ stack that torch's native code adds to its warnings and errors (``Exception raised
  from ... (most recent call first):`` and its ``frame #N:`` lines: e.g. torch's TCPStore client
  warns with about 40 of them when the rank that hosts the store dies) is one line: where it was
  raised, how many frames, and where they are kept.

Full tracebacks are kept: in ``DIR/rank.<rank>/stderr`` with ``--output-filename`` (those files
hold every line as the rank wrote it), else in a *tracebacks file*, made on the first traceback
shortened (`RankOutput.tracebacks_path`), which holds each shortened traceback whole, its lines
prefixed as the others. Where the tracebacks files go and how long they stay:

* in one directory of this user's: ``$HOROVOD_COMPAT_TRACEBACKS_DIR``, else
  ``horovod-compat-tracebacks-<uid>`` in the temporary directory (``$TMPDIR``, else ``/tmp``;
  not ``$XDG_RUNTIME_DIR``, emptied at logout, while a failed job's tracebacks are often read
  later). It is created with mode 0700 if missing, and must be this user's and closed to others
  (mode 0700): otherwise it is not used, and tracebacks are shown in full, one line saying why;
* named ``tracebacks-<YYYYmmdd-HHMMSS>-<random>.log``, by the time the file was made;
* a job that succeeds removes its file when it ends: the file is there to explain a failure,
  and a job that ends well needs none (``--verbose`` shows every traceback whole, as printed); a
  job that fails keeps it, and the last line of its error names it (`KEPT_LINE`);
* only the `KEEP_FILES` most recent files (by modification time) stay: making one removes the
  older ones. Only this user's plain files with that name are ever removed: a directory chosen
  with the variable may hold other files.
"""
from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
import threading
import time
from typing import IO, Dict, List, Optional, Tuple

from distributor.engine import is_knock_on
from distributor.errors import (
    TRACEBACK_HEADER, DistributedRunError, fold_frames, fold_package, parse_exception_line,
)
from distributor.forkserver_daemon import private_dir_problem

#: The package whose frames the Horovod front ends fold in the tracebacks they show.
PACKAGE = __name__.split(".")[0]
fold_package(PACKAGE)

#: A traceback longer than this many lines is shown as it is (and never held back longer).
_MAX_TRACEBACK_LINES = 2000
_CHAIN_LINES = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)

#: The variable naming the directory of the tracebacks files (see the module).
TRACEBACKS_DIR_VAR = "HOROVOD_COMPAT_TRACEBACKS_DIR"
#: How many tracebacks files a directory keeps: the most recent ones.
KEEP_FILES = 20
#: The last line of a failed job's error when its tracebacks file was made.
KEPT_LINE = "Full tracebacks of the ranks (shown shortened above): {path}"
_FILE_NAME = re.compile(r"tracebacks-\d{8}-\d{6}-\w+\.log")
#: The first line of a C++ stack in the text of a c10::Error (torch's native errors and warnings),
#: and the lines of its frames.
_CPP_STACK = re.compile(r"(Exception raised from .*) \(most recent call first\):$")
_CPP_FRAME = re.compile(r"frame #\d+: |<omitting python frames>$")


def tracebacks_dir() -> str:
    """The directory of the tracebacks files: ``$HOROVOD_COMPAT_TRACEBACKS_DIR``, else
    ``horovod-compat-tracebacks-<uid>`` in the temporary directory."""
    return os.environ.get(TRACEBACKS_DIR_VAR) or os.path.join(
        tempfile.gettempdir(), f"horovod-compat-tracebacks-{os.getuid()}")


def new_tracebacks_file(directory: Optional[str] = None) -> Tuple[IO[str], str]:
    """A new tracebacks file, open for writing, and its path, in `directory` (default:
    `tracebacks_dir()`, created 0700 if missing); the older files beyond the `KEEP_FILES` most
    recent are removed. OSError saying what is wrong with the directory if it is not this
    user's alone."""
    directory = directory or tracebacks_dir()
    problem = private_dir_problem(directory)
    if problem is not None:
        raise OSError(problem)
    fd, path = tempfile.mkstemp(prefix=time.strftime("tracebacks-%Y%m%d-%H%M%S-"), suffix=".log",
                                dir=directory)
    _remove_old_files(directory, path)
    return os.fdopen(fd, "w"), path


def _remove_old_files(directory: str, new: str) -> None:
    """Remove the tracebacks files of `directory` beyond the `KEEP_FILES` most recent, the file
    `new` counted as the most recent (its time may equal another's)."""
    found = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if not _FILE_NAME.fullmatch(name) or path == new:
            continue
        try:
            info = os.lstat(path)
        except FileNotFoundError:  # removed by another job meanwhile
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            found.append((info.st_mtime_ns, name, path))
    for *_, path in sorted(found, reverse=True)[KEEP_FILES - 1:]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def padded_rank(rank: int, size: int) -> str:
    """`rank` with leading zeros to the width of the largest rank (Horovod's folder names)."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


def line_prefix(rank: Optional[int], stream: str, timestamps: bool = False) -> str:
    """Horovod's prefix of a rank's output line: ``[1]<stdout>:``, after ``time.asctime()``
    when timestamped; ``[launcher]<stderr>:`` for the launcher's own lines."""
    stamp = time.asctime() if timestamps else ""
    return f"{stamp}[{'launcher' if rank is None else rank}]<{stream}>:"


class RankOutput:
    """An engine output handler: each line printed with Horovod's prefix to `stdout`/`stderr`
    (default: this process's), optionally timestamped and copied to per-rank files; tracebacks
    shortened as the module says unless `verbose`.

    The files hold the lines as the rank wrote them (timestamped if asked). Call `close()` after
    the job, or use it as a context manager around the launch: leaving the ``with`` block also
    removes the tracebacks file if the launch succeeded, and names it in the last line of the
    launch's `DistributedRunError` if it failed (see the module).
    """

    def __init__(
        self,
        stdout: Optional[IO[str]] = None,
        stderr: Optional[IO[str]] = None,
        timestamps: bool = False,
        directory: Optional[str] = None,
        size: int = 1,
        verbose: bool = False,
    ) -> None:
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._timestamps = timestamps
        self._directory = directory
        self._size = size
        self._verbose = verbose
        self._files: Dict[Tuple[int, str], IO[str]] = {}
        self._tracebacks: Dict[int, _Tracebacks] = {}
        self._kept: Optional[IO[str]] = None  # the tracebacks file, without `directory`
        self.tracebacks_path: Optional[str] = None
        self._unkept = False  # no tracebacks file could be made: tracebacks are shown in full
        self._lock = threading.Lock()
        if directory:
            os.makedirs(directory, exist_ok=True)
            for rank in range(size):  # every rank gets its files, even one that prints nothing
                for stream in ("stdout", "stderr"):
                    self._file(rank, stream)

    def _file(self, rank: int, stream: str) -> IO[str]:
        handle = self._files.get((rank, stream))
        if handle is None:
            folder = os.path.join(self._directory or "", f"rank.{padded_rank(rank, self._size)}")
            os.makedirs(folder, exist_ok=True)
            handle = self._files[(rank, stream)] = open(os.path.join(folder, stream), "w")
        return handle

    def __call__(self, rank: Optional[int], stream: str, line: str) -> None:
        with self._lock:
            if self._directory and rank is not None:
                handle = self._file(rank, stream)
                handle.write(f"{time.asctime() + ' ' if self._timestamps else ''}{line}\n")
                handle.flush()
            if rank is None or stream != "stderr" or self._verbose:
                self._print(rank, stream, [line])
                return
            tracebacks = self._tracebacks.get(rank)
            if tracebacks is None:
                tracebacks = self._tracebacks[rank] = _Tracebacks(lambda: self._keep_path(rank))
            self._print(rank, stream, tracebacks.feed(line, lambda block: self._keep(rank, block)))

    def _print(self, rank: Optional[int], stream: str, lines: List[str]) -> None:
        if not lines:
            return
        target = self._streams.get(stream) or (sys.stdout if stream == "stdout" else sys.stderr)
        prefix = line_prefix(rank, stream, self._timestamps)
        target.write("".join(f"{prefix}{line}\n" for line in lines))
        target.flush()

    def _keep_path(self, rank: int) -> Optional[str]:
        """Where the full tracebacks of `rank` are kept; None if nowhere (then they are shown in
        full: the tracebacks directory cannot be used, as one line has said)."""
        if self._directory:
            return os.path.join(self._directory, f"rank.{padded_rank(rank, self._size)}", "stderr")
        if self.tracebacks_path is None and not self._unkept:
            try:
                self._kept, self.tracebacks_path = new_tracebacks_file()
            except OSError as exc:
                self._unkept = True
                self._print_own(f"tracebacks are shown in full, none can be kept in a file: "
                                f"{exc}, or set {TRACEBACKS_DIR_VAR} to another directory")
        return self.tracebacks_path

    def _print_own(self, line: str) -> None:
        """Print a line of horovod-compat's own on the driver's stderr."""
        target = self._streams.get("stderr") or sys.stderr
        target.write(f"horovod-compat: {line}\n")
        target.flush()

    def _keep(self, rank: int, block: List[str]) -> None:
        """Keep a traceback shown shortened (already in the rank's file with a `directory`)."""
        if self._directory or self._keep_path(rank) is None:
            return
        prefix = line_prefix(rank, "stderr", self._timestamps)
        self._kept.write("".join(f"{prefix}{line}\n" for line in block))
        self._kept.flush()

    def close(self) -> None:
        with self._lock:
            for rank, tracebacks in sorted(self._tracebacks.items()):
                self._print(rank, "stderr", tracebacks.flush())
            files, self._files = self._files, {}
            kept, self._kept = self._kept, None
        for handle in files.values():
            handle.close()
        if kept is not None:
            kept.close()

    def __enter__(self) -> "RankOutput":
        return self

    def __exit__(self, exc_type: object, error: Optional[BaseException], tb: object) -> None:
        self.close()
        path = self.tracebacks_path
        if path is None:
            return
        if error is None:  # the launch succeeded
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        elif isinstance(error, DistributedRunError):
            error.add_line(KEPT_LINE.format(path=path))


class _Tracebacks:
    """One rank's stderr lines, with the tracebacks in them shortened (see the module).

    A traceback is held back from its first line to its exception's line (one write of the
    rank's exception hook), then shown at once. Blank and chaining lines after a traceback shown
    as one line are held until the next line says whether they join two knock-on errors (then
    they are dropped). A C++ stack is held from its first line to its last frame."""

    def __init__(self, where) -> None:
        self._where = where
        self._block: Optional[List[str]] = None
        self._cpp: Optional[List[str]] = None
        self._held: List[str] = []
        self._after_one_line = False

    def feed(self, line: str, keep) -> List[str]:
        if self._cpp is not None:
            if _CPP_FRAME.match(line) and len(self._cpp) < _MAX_TRACEBACK_LINES:
                self._cpp.append(line)
                return []
            stack, self._cpp = self._cpp, None
            return self._finish_cpp(stack, keep) + self.feed(line, keep)
        if self._block is None and _CPP_STACK.match(line):
            self._cpp = [line]
            return []
        if self._block is not None:
            if line.startswith(" ") and len(self._block) < _MAX_TRACEBACK_LINES:
                self._block.append(line)
                return []
            block, self._block = self._block + [line], None
            if line.startswith(" "):  # too long to be held back: shown as it is
                return self._release(block)
            return self._finish(block, keep)
        if line == TRACEBACK_HEADER:
            self._block = [line]
            return []
        if self._after_one_line and (line == "" or line in _CHAIN_LINES):
            self._held.append(line)
            return []
        return self._release([line])

    def _release(self, lines: List[str]) -> List[str]:
        out, self._held, self._after_one_line = self._held + lines, [], False
        return out

    def _finish(self, block: List[str], keep) -> List[str]:
        _, message = parse_exception_line(block[-1])
        knock_on = is_knock_on(message)
        folded = block if knock_on else fold_frames(block)
        where = self._where() if knock_on or folded != block else None
        if where is None:  # nothing to shorten, or nowhere to keep it whole
            return self._release(block)
        keep(block)
        if knock_on:
            line = f"{block[-1]} [full traceback: {where}]"
            chained = self._after_one_line and any(h in _CHAIN_LINES for h in self._held)
            out = ([] if chained else self._held) + [line]
            self._held, self._after_one_line = [], True
            return out
        return self._release(folded)

    def _finish_cpp(self, stack: List[str], keep) -> List[str]:
        where = self._where() if len(stack) > 1 else None
        if where is None:  # no frames, or nowhere to keep them
            return self._release(stack)
        keep(stack)
        raised = _CPP_STACK.match(stack[0]).group(1)
        return self._release([f"{raised} [C++ stack of {len(stack) - 1} lines: {where}]"])

    def flush(self) -> List[str]:
        """What is held back, as it is (the rank's output ended)."""
        out = self._held + (self._block or []) + (self._cpp or [])
        self._held, self._block, self._cpp, self._after_one_line = [], None, None, False
        return out
