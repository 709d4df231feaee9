"""One simulated run, through the engine's in-process capability (`chaos.contract`): the
engine's own loops run as scheduled threads (see `chaos.sim.scheduler`) against the
in-process fakes (`chaos.sim.world`), and the SimResult has the same history, snapshot and
verdicts a real run would give. The adapter's `simulate(spec, choices, keep_db=None)` does it
all where it has one (the reference engine); otherwise its `in_process` hooks are run by
`chaos.sim.threads`."""
from __future__ import annotations

from chaos.contract import has
from chaos.sim.choices import Choices
from chaos.sim.spec import SimResult, SimSpec


def simulate(spec: SimSpec, choices: Choices, *, keep_db: str | None = None) -> SimResult:
    """Run one schedule of `spec` with decisions from `choices`; return its result.

    keep_db: copy the finished database to this path. Raises ValueError for an engine that
    does not declare the in_process capability."""
    if not has(spec.engine, "in_process"):
        raise ValueError(f"engine {spec.engine_spec!r} cannot run in simulation: it does not "
                         "declare the in_process capability (see docs/engines.md)")
    if hasattr(spec.engine, "simulate"):
        return spec.engine.simulate(spec, choices, keep_db=keep_db)
    from chaos.sim.threads import simulate as threaded
    return threaded(spec, choices, keep_db=keep_db)
