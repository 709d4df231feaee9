"""The SQS engine (examples/sqs_engine), a correct engine of a queue's shape, in `ninelives
sim`: it holds every claim it gives evidence for under `smoke` and `lost-lease`, its opaque
receipts and its one receive count read as it declares them, and a seed replays exactly."""
from __future__ import annotations

import pytest

from chaos.contract import load_engine
from chaos.spec.scenario import load_scenario
from chaos.sim import SeededChoices, SimSpec, simulate

SQS = "examples.sqs_engine.adapter:SQS"


def sim(scenario: str, seed: int):
    engine = load_engine(SQS)
    spec = SimSpec(load_scenario(scenario, "ci", engine=engine), seed, engine, SQS)
    return simulate(spec, SeededChoices(seed))


@pytest.mark.parametrize("scenario", ["smoke", "lost-lease"])
def test_the_sqs_engine_holds_every_claim_it_gives_evidence_for(scenario):
    for seed in (1, 2, 3):
        result = sim(scenario, seed)
        assert not result.errors, result.errors
        failed = [(v.name, [f.message for f in v.failures[:2]])
                  for v in result.verdicts if v.valid is False]
        assert not failed, (scenario, seed, failed)
        unknown = {v.name for v in result.verdicts if v.valid is None}
        # no spend record, no declared claim rules, no operator action in these scenarios,
        # no deadline put to the test without a hang, no power cut
        assert unknown <= {"cost-accounted", "claims-prompt", "operator-moves",
                           "deadlines-kept", "durable-commits"}, unknown


def test_receipts_fence_and_one_receive_count_caps():
    result = sim("lost-lease", 1)
    claims = [e for e in result.history if e.get("src") == "engine" and e["type"] == "claimed"]
    tokens = [e["token"] for e in claims]
    assert len(set(tokens)) == len(tokens), "a receipt names one receive"
    beats = [e for e in result.history if e.get("type") == "state" and e.get("heartbeat")]
    assert beats and all(e["token"] in tokens for e in beats)
    settings = load_engine(SQS).settings({"lease": 1.0, "max_claims": 12})
    assert (settings.token_order, settings.cap_counts, settings.max_claims,
            settings.max_attempts) == ("opaque", "claims", 12, None)


def test_a_seed_replays_exactly():
    assert sim("lost-lease", 2).signature() == sim("lost-lease", 2).signature()
