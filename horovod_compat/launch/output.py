"""Where the ranks' output goes on the driver, as Horovod's launchers offer it: chosen streams,
timestamped lines (``prefix_output_with_timestamp``) and one folder per rank
(``--output-filename DIR`` → ``DIR/rank.<rank>/stdout`` and ``.../stderr``, the rank zero-padded so
that the folders sort in rank order)."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Dict, Optional, Tuple


def padded_rank(rank: int, size: int) -> str:
    """`rank` with leading zeros to the width of the largest rank (Horovod's folder names)."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


class RankOutput:
    """An engine output handler: each line printed with its rank prefix to `stdout`/`stderr`
    (default: this process's), optionally timestamped and copied to per-rank files.

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
    ) -> None:
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._timestamps = timestamps
        self._directory = directory
        self._size = size
        self._files: Dict[Tuple[int, str], IO[str]] = {}
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
        stamp = time.asctime() + " " if self._timestamps else ""
        prefix = "[launcher]" if rank is None else f"[rank {rank}]"
        with self._lock:
            target = self._streams.get(stream) or (sys.stdout if stream == "stdout" else sys.stderr)
            target.write(f"{stamp}{prefix} {line}\n")
            target.flush()
            if self._directory and rank is not None:
                handle = self._file(rank, stream)
                handle.write(f"{stamp}{line}\n")
                handle.flush()

    def close(self) -> None:
        with self._lock:
            files, self._files = self._files, {}
        for handle in files.values():
            handle.close()

    def __enter__(self) -> "RankOutput":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
