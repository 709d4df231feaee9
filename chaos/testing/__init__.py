"""Crash-safety checks in a user's own test suite: the pytest plugin, its checks, the failing seeds
it remembers, and Hypothesis strategies."""
