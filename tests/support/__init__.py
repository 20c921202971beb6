"""Helpers the tests share (never collected as tests): run-output readers and launchers, tiny checkpoints,
loss inputs, converter sources, a fault launcher and deliberately nondeterministic modules."""
