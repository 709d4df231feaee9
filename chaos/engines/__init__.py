"""How the harness meets an engine it did not write: the schema an adapter's operations and
snapshot are read against, the guard around adapter code, the crash points by role, write
attribution, and `ninelives doctor`."""
