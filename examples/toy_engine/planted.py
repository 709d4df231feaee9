"""Planted bugs of the toy engine: each a subclass of its Worker or Sender with ONE mechanism
removed, documented with the guarantee it breaks, and an adapter for `--engine`:

    ninelives sim smoke --engine examples.toy_engine.planted:SENT_BEFORE_SEND

A real run starts its processes as `python -m examples.toy_engine.planted NAME ROLE ...`,
the toy's command line with the planted class in place of the toy's. The toy itself
(`examples.toy_engine.adapter:TOY`) is correct; these are not.
"""
from __future__ import annotations

import sys

from chaos import probe
from chaos.contract import Command, ProcessContext

from . import calls, jobs, store
from .adapter import ToyEngine
from .inprocess import ToyInProcess
from .sender import Sender
from .worker import Worker

DONE = tuple(step[3] for step in jobs.STEPS)


class UnfencedCompletionWorker(Worker):
    """The step's completion writes over whatever the job's document is now, not only over
    the document it claimed.

    Breaks: a worker writes only while it holds the job's lease. A worker whose lease ran out
    and whose job another worker claimed since (a zombie: paused, or slower than its lease)
    still completes the step, over the new holder's lease (`fenced-writes`)."""

    def commit(self, key: str, text: str, new: dict) -> bool:
        if new["status"] not in DONE:
            return super().commit(key, text, new)
        with store.write(self.conn):
            probe.point("before_commit", key)
            current = store.get(self.conn, key)
            written = current is not None and store.swap(self.conn, key, current, new) is not None
        if written:
            self.steps += 1
            probe.point("after_commit", key)
        return written


class HalfJitterWorker(Worker):
    """Backoff draws its wait from the lower half of the full-jitter range only.

    Breaks: a retry's wait spreads over [0, bound] (full jitter), so that retries of many
    jobs after one outage do not bunch up. Every wait is still within its bounds; only their
    spread is wrong (`retry-discipline`)."""

    def wait(self, attempt: int, retry_after: float | None) -> float:
        wait = self.rng.uniform(0.0, self.settings.backoff_bound(attempt) / 2.0)
        return max(wait, retry_after) if retry_after is not None else wait


class EffectsApartWorker(Worker):
    """The publish step, finished from the summarize step's memo without a call, commits
    the job's completion first and queues its effect in a second transaction.

    Breaks: a step's effects are queued in the transaction that completes it. A crash
    between the two writes (at `after_commit`) leaves a published job whose effect was never
    queued, so never sent (`effects-complete`)."""

    def work(self, key: str, text: str, doc: dict) -> None:
        if doc["step"] != "publish":
            return super().work(key, text, doc)
        summary = doc["memo"]["summarize"]["output"]
        effect = {"job": key, "kind": jobs.EFFECT_KIND, "summary": summary.get("summary"),
                  "digest": summary.get("digest")}
        now = self.clock()
        if not self.commit(key, text, jobs.finish(doc, self.id, now)):
            return
        queued = jobs.finish(doc, self.id, now, effect=effect)["effects"]

        def queue(current: dict) -> dict:
            if not any(e["kind"] == jobs.EFFECT_KIND for e in current["effects"]):
                current["effects"] = current["effects"] + queued
            return current
        store.update(self.conn, key, queue)


class SentBeforeSendSender(Sender):
    """The sender marks the effect sent before it posts it.

    Breaks: an effect is marked sent only once the receiver has it. A sender killed between
    the mark and the post, or whose post fails, leaves an effect marked sent that the
    receiver never applied, and nobody sends it again (`effects-complete`)."""

    def tick(self) -> bool:
        claimed = self.claim()
        if claimed is None:
            return False
        key, kind, effect = claimed
        self.settle(key, kind, {"sent": True, "sent_at": self.clock(), "error": None})
        probe.point("before_send", key)
        try:
            calls.send_effect(self.receiver_url, effect["key"], effect["body"],
                              self.settings.send_timeout, sender=self.id)
        except (calls.Retryable, calls.Poison):
            self.failed += 1     # already marked sent: nothing is tried again
            return True
        probe.point("after_send", key)
        self.sent += 1
        return True


#: name -> (worker class, sender class)
PLANTED = {"unfenced_completion": (UnfencedCompletionWorker, Sender),
           "half_jitter": (HalfJitterWorker, Sender),
           "effects_apart": (EffectsApartWorker, Sender),
           "sent_before_send": (Worker, SentBeforeSendSender)}


class PlantedInProcess(ToyInProcess):
    """The toy's in-process hooks, running the planted classes."""

    def __init__(self, worker_type: type, sender_type: type) -> None:
        self.worker_type, self.sender_type = worker_type, sender_type

    def worker(self, proc) -> None:
        self._loop(proc, lambda conn, s: self.worker_type(
            conn, s, proc.context.provider_url, rng=proc.rng, clock=proc.now))

    def sender(self, proc) -> None:
        self._loop(proc, lambda conn, s: self.sender_type(
            conn, s, proc.context.receiver_url, rng=proc.rng, clock=proc.now))


class PlantedToy(ToyEngine):
    """The toy's adapter, whose processes run planted bug `planted`."""

    def __init__(self, planted: str) -> None:
        self.planted = planted
        self.name = f"toy:{planted}"
        self.in_process = PlantedInProcess(*PLANTED[planted])

    def command(self, role: str, ctx: ProcessContext) -> Command:
        command = super().command(role, ctx)
        module = command.argv.index("examples.toy_engine")
        return Command([*command.argv[:module], "examples.toy_engine.planted", self.planted,
                        *command.argv[module + 1:]], command.env)


UNFENCED_COMPLETION = PlantedToy("unfenced_completion")
HALF_JITTER = PlantedToy("half_jitter")
EFFECTS_APART = PlantedToy("effects_apart")
SENT_BEFORE_SEND = PlantedToy("sent_before_send")


def main(argv: list[str]) -> int:
    """`python -m examples.toy_engine.planted NAME ROLE [flags...]`: the toy's command line
    with planted bug NAME's classes."""
    if not argv or argv[0] not in PLANTED:
        print(f"usage: python -m examples.toy_engine.planted NAME ROLE [flags...]; NAME is one "
              f"of: {', '.join(PLANTED)}", file=sys.stderr)
        return 2
    from . import __main__ as cli
    cli.Worker, cli.Sender = PLANTED[argv[0]]
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
