"""The command line: `ninelives` and its flags, interrupts, the lease sweep."""
