"""What user code inside a rank can use of the engine: send a message to the driver.

`send_to_driver(obj)` delivers a picklable object to the driver's message handler (by default it
is printed there as `[rank N] obj`); front ends use it for log callbacks such as sparkdl's
`log_to_driver`.
"""
from __future__ import annotations

from typing import Any, Optional

from .protocol import Channel, Kind

_channel: Optional[Channel] = None
_rank: Optional[int] = None


def attach(channel: Channel, rank: int) -> None:
    """Called by the rank entry point once the rank is connected to the driver hub."""
    global _channel, _rank
    _channel, _rank = channel, rank


def in_rank() -> bool:
    """True inside a rank process started by this engine."""
    return _channel is not None


def send_to_driver(message: Any) -> None:
    """Send `message` to the driver now; raises RuntimeError outside a rank of this engine."""
    if _channel is None or _rank is None:
        raise RuntimeError(
            "send_to_driver works only inside a rank started by distributor "
            "(TorchDistributor, HorovodRunner or distributor.run_function)."
        )
    _channel.send(Kind.MESSAGE, (_rank, message))
