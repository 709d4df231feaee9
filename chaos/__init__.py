"""The chaos harness: fakes of the outside world, fault injection and the runs that prove the engine."""
