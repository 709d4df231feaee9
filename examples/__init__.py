"""Engines we did not design, each with its adapter to the harness contract."""
