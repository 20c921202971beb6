"""A DDP rank whose peer is gone: one line naming the peer and the timeout, and exit code 1, not gloo's traceback.

When a node dies, the socket to its process closes and the next collective on every other rank fails at once
with gloo's "Connection reset by peer"; a rank whose peer hangs instead waits for the process-group timeout.
"""

import os
import re
from contextlib import contextmanager

from utils.ddp import DistInfo, process_group_timeout
from utils.logging import LOGGER
from utils.training.interrupts import flush_output

# What gloo's TCP transport says when the process at the other end of a connection is gone
PEER_LOSS_MARKERS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def lost_peer_line(error: BaseException, info: DistInfo) -> str | None:
    """One line for a collective that failed because another rank's process is gone, else None.

    gloo names the peer only by its socket address; with two ranks that peer is the other rank.
    """
    text = str(error)
    reason = next((marker for marker in PEER_LOSS_MARKERS if marker in text), None)
    if not info.enabled or reason is None:
        return None
    peer = f"rank {1 - info.rank}" if info.world_size == 2 else "another rank"
    address = re.search(r"\[[^\]]*\]:\d+", text)  # e.g. [127.0.0.1]:4311
    minutes = process_group_timeout().total_seconds() / 60
    return (f"rank {info.rank} lost {peer}{f' at {address[0]}' if address else ''} ({reason}): its process or "
            f"node stopped, so this rank stops too; ranks still waiting give up after the process-group timeout "
            f"(FFCA_DDP_TIMEOUT_MIN={minutes:g} min). See that node's log, then --resume on every node")


@contextmanager
def exit_on_lost_peer(info: DistInfo):
    """Run the block; if a collective fails because another rank is gone, log one ``ERROR:`` line and exit 1.

    The process ends at once (``os._exit``): destroying the process group would wait on the lost rank.
    """
    try:
        yield
    except RuntimeError as e:
        line = lost_peer_line(e, info)
        if line is None:
            raise
        LOGGER.error(line)  # the logger writes "ERROR: " before it
        flush_output()
        os._exit(1)
