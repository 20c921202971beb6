"""A DDP rank whose peer is gone: one line naming the peer and the timeout, and exit code 1, not a traceback.

When a node dies, the socket to its process closes and the next collective on every other rank fails at once
with gloo's "Connection reset by peer"; a rank whose peer hangs instead waits for the process-group timeout.
NCCL reports the same events in its own words: a collective that timed out in its watchdog, a remote error
when a peer's process exited, a communicator aborted after an error on any rank.
"""

import os
import re
from contextlib import contextmanager

from utils.ddp import DistInfo, process_group_timeout
from utils.logging import LOGGER
from utils.stop_signals import flush_output

# (text in the error, what the line calls it), the first match wins. gloo's TCP transport says the first three
# when the process at the other end of a connection is gone; NCCL (through torch's ProcessGroupNCCL) the rest.
# A bare "ProcessGroupNCCL" is not among them: configuration errors name it too.
PEER_LOSS_MARKERS = (
    ("Connection reset by peer", "Connection reset by peer"),
    ("Connection closed by peer", "Connection closed by peer"),
    ("Broken pipe", "Broken pipe"),
    ("Watchdog caught collective operation timeout", "NCCL collective timed out"),
    ("ncclRemoteError", "NCCL remote error: a peer's process exited or the network failed"),
    ("remote process exit", "NCCL remote error: a peer's process exited or the network failed"),
    ("NCCL communicator was aborted", "NCCL communicator aborted after an error"),
    ("ProcessGroupNCCL's watchdog got stuck", "NCCL watchdog stuck"),
)
NCCL_ERROR = re.compile(r"NCCL error in: [^,\n]*, ([^\n]*)")  # torch's "NCCL error in: FILE:LINE, WHAT"


def lost_peer_line(error: BaseException, info: DistInfo) -> str | None:
    """One line for a collective that failed because another rank's process is gone, else None.

    gloo names the peer only by its socket address; with two ranks that peer is the other rank. NCCL
    names the rank a remote error came from when it knows it. Any other NCCL error also gets one line,
    which says that it may, not that it did, come from a lost peer.
    """
    text = str(error)
    if not info.enabled:
        return None
    reason = next((name for marker, name in PEER_LOSS_MARKERS if marker in text), None)
    minutes = process_group_timeout().total_seconds() / 60
    timeout = f"(FFCA_DDP_TIMEOUT_MIN={minutes:g} min)"
    if reason is None:
        nccl = NCCL_ERROR.search(text)
        return None if nccl is None else (
            f"rank {info.rank}: NCCL error ({nccl[1].strip()}): a collective failed on this rank, so it stops; "
            f"if another rank's process or node stopped, the ranks still waiting give up after the process-group "
            f"timeout {timeout}. NCCL_DEBUG=INFO prints NCCL's detail; fix the cause, then --resume on every node")
    remote_rank = re.search(r"remote error detected from rank:? (\d+)", text)
    if remote_rank:
        peer = f"rank {remote_rank[1]}"
    else:
        peer = f"rank {1 - info.rank}" if info.world_size == 2 else "another rank"
    address = re.search(r"\[[^\]]*\]:\d+", text)  # e.g. [127.0.0.1]:4311
    return (f"rank {info.rank} lost {peer}{f' at {address[0]}' if address else ''} ({reason}): its process or "
            f"node stopped, so this rank stops too; ranks still waiting give up after the process-group timeout "
            f"{timeout}. See that node's log, then --resume on every node")


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
