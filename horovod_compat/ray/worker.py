"""One rank of a ``RayExecutor``: a Ray actor process that keeps its environment, its executable and
its Horovod group (``hvd.init()`` in the first function it runs) from ``start()`` to ``shutdown()``.

Horovod 0.28.1 called this class ``BaseHorovodWorker``; Ray Train's Horovod backend and user code
that subclasses it use that name. It knows nothing of Ray itself but for the node id: the executor
makes it an actor (``ray.remote(BaseHorovodWorker)``).
"""
from __future__ import annotations

import os
import socket
import traceback
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

__all__ = ["BaseHorovodWorker", "RankFunctionError"]


class RankFunctionError(Exception):
    """What a function raised in a rank, sent to the driver: the exception's type name, its text
    and the rank's formatted traceback (source lines included where the file is readable there)."""

    def __init__(self, rank: int, host: str, kind: str, text: str, trace: str) -> None:
        super().__init__(rank, host, kind, text, trace)
        self.rank, self.host, self.kind, self.text, self.trace = rank, host, kind, text, trace

    def __str__(self) -> str:
        return f"rank {self.rank} (on {self.host}) raised {self.kind}: {self.text}\n{self.trace}"


class BaseHorovodWorker:
    """A rank: `world_rank` of `world_size` until the executor gives it its final place (ranks are
    grouped by node once every actor has said where it runs)."""

    executable: Any = None

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        os.environ["HOROVOD_RANK"] = str(world_rank)
        os.environ["HOROVOD_SIZE"] = str(world_size)

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def hostname(self) -> str:
        return socket.gethostname()

    def placement(self) -> Tuple[str, str, str, int]:
        """(node id, host name, the node's address, this process's pid)."""
        import ray

        return self.node_id(), self.hostname(), ray.util.get_node_ip_address(), os.getpid()

    def free_port(self, address: str) -> int:
        """A port free on this node, for the job's rendezvous store (rank 0's)."""
        from distributor.rank_env import free_port

        return free_port(address)

    def update_env_vars(self, env_vars: Dict[str, Any]) -> None:
        os.environ.update({key: str(value) for key, value in env_vars.items()})

    def env_vars(self) -> Dict[str, str]:
        return dict(os.environ)

    def start_executable(self, executable_cls: Optional[type] = None, executable_args: Sequence = (),
                         executable_kwargs: Optional[Dict[str, Any]] = None) -> None:
        from distributor import netif

        # the interface of the route to rank 0's node, as a rank of any other launcher gets it
        os.environ.update(netif.interface_env(os.environ))
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **(executable_kwargs or {}))

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` in this rank; what it raises comes back as a RankFunctionError."""
        try:
            return fn(self.executable)
        except BaseException as exc:  # (SystemExit too: the driver names the rank either way)
            raise RankFunctionError(int(os.environ.get("HOROVOD_RANK", "0")), socket.gethostname(),
                                    type(exc).__name__, str(exc), traceback.format_exc()) from None
