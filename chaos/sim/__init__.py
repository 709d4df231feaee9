"""Deterministic simulation: the real engine's workers and senders as threads that run one at
a time at the engine's crash points, on a virtual clock, against a real SQLite file, in one
process. The same seed gives the same schedule and a byte-identical history; a failing
schedule shrinks (with Hypothesis) to a minimal one that replays exactly.

    from chaos.sim import SimSpec, SeededChoices, simulate, shrink, replay
    result = simulate(SimSpec(scenario, seed=7), SeededChoices(7))
    result.failed            # the verdicts that did not pass (the same checkers as a real run)
    shrunk = shrink(result)  # when it failed: the smallest schedule failing the same way

`ninelives sim` is the command line (chaos.sim.cli). An engine takes part through the
contract's in_process capability: its adapter's in-process hooks, run by chaos.sim.threads
(with SQLite on the virtual clock, chaos.sim.sqlite), or its own `simulate` (the reference
engine's, chaos.reference.inprocess); both on the engine-neutral run of chaos.sim.driver.
The scheduler and the virtual clock: chaos.sim.scheduler; the fakes: chaos.sim.world.
"""
from chaos.sim.choices import DrawnChoices, ReplayChoices, ReplayDiverged, SeededChoices
from chaos.sim.run import simulate
from chaos.sim.spec import SimResult, SimSpec
from chaos.sim.shrink import Shrunk, load_schedule, replay, save_schedule, shrink
from chaos.sim.story import headline, tell

__all__ = ["DrawnChoices", "ReplayChoices", "ReplayDiverged", "SeededChoices", "SimResult",
           "SimSpec", "Shrunk", "headline", "load_schedule", "replay", "save_schedule",
           "shrink", "simulate", "tell"]
