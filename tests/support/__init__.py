"""Helpers the tests share: run-output readers, a fault launcher and deliberately nondeterministic modules."""
