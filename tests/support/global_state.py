"""PyTorch's process-wide switches, put back as they were: for tests that run a whole command in the test process."""

import os
from contextlib import contextmanager

import torch


@contextmanager
def kept_determinism_switches():
    """The determinism switches, cuDNN's flags and the NaN fill of new tensors as they were on entry."""
    state = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.utils.deterministic.fill_uninitialized_memory)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(state[0], warn_only=state[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = state[2], state[3]
        torch.utils.deterministic.fill_uninitialized_memory = state[4]


@contextmanager
def kept_process_state():
    """:func:`kept_determinism_switches`, plus the environment, torch's thread count and its random state."""
    environ, threads, rng = dict(os.environ), torch.get_num_threads(), torch.get_rng_state()
    try:
        with kept_determinism_switches():
            yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
