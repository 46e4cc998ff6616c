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
  exception's line and where its full traceback is.

Full tracebacks are kept: in ``DIR/rank.<rank>/stderr`` with ``--output-filename`` (those files
hold every line as the rank wrote it), else in a file ``horovod-tracebacks-*.log`` in the temporary
directory, made on the first traceback shortened (`tracebacks_path`).
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from typing import IO, Dict, List, Optional, Tuple

from distributor.engine import is_knock_on
from distributor.errors import TRACEBACK_HEADER, fold_frames, fold_package, parse_exception_line

#: The package whose frames the Horovod front ends fold in the tracebacks they show.
PACKAGE = __name__.split(".")[0]
fold_package(PACKAGE)

#: A traceback longer than this many lines is shown as it is (and never held back longer).
_MAX_TRACEBACK_LINES = 2000
_CHAIN_LINES = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


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
    the job.
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

    def _keep_path(self, rank: int) -> str:
        """Where the full tracebacks of `rank` are kept."""
        if self._directory:
            return os.path.join(self._directory, f"rank.{padded_rank(rank, self._size)}", "stderr")
        if self.tracebacks_path is None:
            fd, self.tracebacks_path = tempfile.mkstemp(prefix="horovod-tracebacks-", suffix=".log")
            self._kept = os.fdopen(fd, "w")
        return self.tracebacks_path

    def _keep(self, rank: int, block: List[str]) -> None:
        """Keep a traceback shown shortened (already in the rank's file with a `directory`)."""
        if self._directory:
            return
        self._keep_path(rank)
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

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Tracebacks:
    """One rank's stderr lines, with the tracebacks in them shortened (see the module).

    A traceback is held back from its first line to its exception's line (one write of the
    rank's exception hook), then shown at once. Blank and chaining lines after a traceback shown
    as one line are held until the next line says whether they join two knock-on errors (then
    they are dropped)."""

    def __init__(self, where) -> None:
        self._where = where
        self._block: Optional[List[str]] = None
        self._held: List[str] = []
        self._after_one_line = False

    def feed(self, line: str, keep) -> List[str]:
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
        if is_knock_on(message):
            keep(block)
            line = f"{block[-1]} [full traceback: {self._where()}]"
            chained = self._after_one_line and any(h in _CHAIN_LINES for h in self._held)
            out = ([] if chained else self._held) + [line]
            self._held, self._after_one_line = [], True
            return out
        folded = fold_frames(block)
        if folded != block:
            keep(block)
        return self._release(folded)

    def flush(self) -> List[str]:
        """What is held back, as it is (the rank's output ended)."""
        out = self._held + (self._block or [])
        self._held, self._block, self._after_one_line = [], None, False
        return out
