"""Training loop parts used by train.py: run state, checkpoints, interrupts, evolve, results log,
schedule and AMP."""
