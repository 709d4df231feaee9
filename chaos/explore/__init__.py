"""Exploration: simulation steered toward the situations not reached yet.

Swarm testing (chaos.sim.swarm: each seed its own mix of the scenario's faults) and
coverage-guided mutation of the simulation's choice sequence: schedules that reach a new
situation of the catalog (chaos.situations), or a known one after a new point or more often
than before, are kept, on disk, and mutated (chaos.explore.schedules); the corpus is replayed
first next time (chaos.explore.corpus). The first failure stops the search and is shrunk as
`ninelives sim --shrink` shrinks one.

    from chaos.explore import Explorer, Corpus
    outcome = Explorer(scenario, engine, "reference", corpus=Corpus("corpus")).explore(60)
    outcome.failure          # the failing SimResult, or None
    outcome.first_reached    # situation -> (seconds, schedules) when first reached

`ninelives explore` is the command line (chaos.explore.cli).
"""
from chaos.explore.corpus import Corpus
from chaos.explore.coverage import Coverage, measure
from chaos.explore.schedules import Candidate, PrefixChoices
from chaos.explore.search import Explorer, Listener, Outcome

__all__ = ["Candidate", "Corpus", "Coverage", "Explorer", "Listener", "Outcome",
           "PrefixChoices", "measure"]
