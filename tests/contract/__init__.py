"""The engine contract, stated once and run against every adapter."""
