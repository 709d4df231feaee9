"""The store backends every contract test runs on (see tests/conftest.py)."""

BACKENDS = ("sqlite", "postgres")
