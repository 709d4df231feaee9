"""The catalog of broken engines: what each removes, which invariants must catch it, and the
scenario (with profile and seed) that provokes it; and their adapters for `--engine`.

Each mutant is the reference engine's adapter whose worker and sender processes start as
`python -m chaos.reference.mutants NAME ROLE` (the patch of chaos.reference.mutants.patches
applied, to the store of the backend its database is on, then the engine's CLI). A mutant of
submission changes the adapter's own `submit` instead, in the harness process, for that
call only. Every mutant runs on both backends unless SQLITE_ONLY says why not.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from chaos.contract import Command, ProcessContext
from chaos.reference.adapter import ReferenceEngine
from chaos.reference.mutants.patches import operator_move_not_written
from chaos.reference.mutants.sql import edit_store_sql, sql_edits


@dataclass(frozen=True)
class Mutant:
    """One catalog entry.

    name: the mutant (and its attribute in chaos.mutants); removes: the mechanism removed,
    in one line; expect: the invariants that must catch it (any one suffices); scenario: the
    scenario that provokes it (a name under scenarios/); profile and seed: how it is run.
    """

    name: str
    removes: str
    expect: tuple[str, ...]
    scenario: str
    profile: str = "smoke"
    seed: int = 1

    @property
    def spec(self) -> str:
        """The --engine value that runs this mutant."""
        return f"chaos.mutants:{self.name}"


CATALOG: tuple[Mutant, ...] = (
    Mutant("no_state_guard",
           "the claim takes a job it read earlier with an update guarded by lease time only, "
           "not by the state (no compare-and-swap on the state)",
           ("legal-transitions",), "mutants/claim-race"),
    Mutant("fail_fenced_by_id",
           "failure and retry writes are guarded by the job id alone, not by the lease token",
           ("fenced-writes", "legal-transitions"), "mutants/zombies"),
    Mutant("no_token_on_complete",
           "completion is guarded by the state alone: no lease token, so a zombie commits",
           ("fenced-writes",), "mutants/zombies"),
    Mutant("heartbeat_ignores_rowcount",
           "the heartbeat extends the lease by job id (no lease token) and ignores its row count",
           ("fenced-writes",), "mutants/zombies"),
    Mutant("claim_steals_live_leases",
           "the claim ignores lease expiry and takes jobs other workers hold",
           ("lease-exclusive",), "mutants/exclusive"),
    Mutant("no_crash_loop_cap",
           "claims per step are not capped: a job that kills its worker loops forever",
           ("bounded-work", "all-jobs-settle"), "mutants/crash-loop-fast"),
    Mutant("memo_check_skipped",
           "the worker never checks for a memo before paying for a step",
           ("no-rebill-after-commit", "memo-consistent"), "mutants/memo-hits"),
    Mutant("memo_last_writer_wins",
           "the memo insert replaces an existing memo (INSERT OR REPLACE, not first writer wins)",
           ("memo-consistent",), "mutants/zombies"),
    Mutant("separate_transactions",
           "state, memo and outbox rows are committed in three separate transactions",
           ("memo-consistent", "effects-complete"), "mutants/torn-steps"),
    Mutant("outbox_after_commit",
           "the outbox rows are inserted in a transaction after the completing one",
           ("effects-complete",), "mutants/torn-completion"),
    Mutant("spend_unrecorded",
           "a failed call leaves no spend record",
           ("cost-accounted",), "poison"),
    Mutant("poison_retried",
           "poison (4xx, unparseable, schema-invalid) is retried like a timeout",
           ("retry-discipline",), "poison"),
    Mutant("retry_after_ignored",
           "backoff ignores the server's Retry-After",
           ("retry-discipline",), "mutants/retry-after"),
    Mutant("backoff_without_jitter",
           "backoff waits exactly its exponential ceiling, without jitter",
           ("retry-discipline",), "mutants/no-jitter"),
    Mutant("jitter_narrowed",
           "backoff draws from the top half of the full-jitter range (random, within bounds)",
           ("retry-discipline",), "provider-outage", profile="ci"),
    Mutant("no_call_deadline",
           "provider calls wait for their answer however long it takes (no call timeout)",
           ("deadlines-kept",), "provider-outage", profile="ci"),
    Mutant("heartbeat_keeps_deadline",
           "the heartbeat rewrites the lease without moving it forward",
           ("lease-kept",), "lost-lease", profile="ci"),
    Mutant("claim_lease_already_over",
           "the claim sets a lease that ended before the claim (found by the mutation score)",
           ("lease-kept", "bounded-work"), "smoke"),
    Mutant("completion_reports_lease_lost",
           "a completion that committed reports its lease lost, dropping the next step's "
           "lease (found by the mutation score)",
           ("lease-kept",), "smoke"),
    Mutant("operator_move_not_written",
           "an operator action reports done without writing the job",
           ("operator-moves",), "operator-actions", profile="ci"),
    Mutant("sender_without_key",
           "the sender posts effects without their Idempotency-Key",
           ("outbox-bounded",), "outbox-ambiguous"),
    Mutant("senders_without_claim",
           "senders ignore outbox leases, so two senders send one row at once",
           ("outbox-bounded",), "mutants/senders"),
    Mutant("mark_sent_before_send",
           "the sender marks a row sent before posting it",
           ("effects-complete",), "outbox-ambiguous"),
    Mutant("dead_letter_at_first_failure",
           "a send that fails for a retryable reason is dead-lettered at once (found by the "
           "mutation score)", ("effects-complete",), "outbox-ambiguous"),
    Mutant("outbox_retry_at_once",
           "a failed send is retried at once, without backoff (found by the mutation score)",
           ("retry-discipline",), "mutants/outbox-retries"),
    Mutant("claims_newest_first",
           "the claim takes the due job that fell due last: old due work waits behind every "
           "newer job", ("claims-prompt",), "smoke"),
    Mutant("outbox_claim_lease_in_past",
           "a sender's claim sets the row's lease to end before the claim", ("lease-kept",),
           "smoke"),
    Mutant("client_fails_before_sending",
           "the provider client raises before the request leaves, and the job is parked as "
           "poison although the provider refused nothing", ("retry-discipline",), "smoke"),
    Mutant("heartbeat_inverted",
           "the worker builds its heartbeat only when heartbeat is off", ("lease-kept",),
           "mutants/slow-calls"),
    Mutant("group_stale_fails_all",
           "a group commit lets one slot's stale write roll back every slot's write of the "
           "group", ("cost-accounted", "lease-kept"), "mutants/slot-zombies"),
    Mutant("heartbeat_one_slot",
           "with job slots the heartbeat beats only for the step that began last",
           ("lease-kept", "lease-exclusive"), "mutants/slot-leases"),
    Mutant("submit_replaces",
           "submit replaces an existing job (INSERT OR REPLACE) instead of keeping it",
           ("submissions-idempotent",), "duplicate-submit"),
    Mutant("commit_not_durable",
           "the store acknowledges a commit before it is durable (synchronous=OFF under a "
           "setting that says FULL): a power cut loses acknowledged transactions",
           ("durable-commits",), "power-loss"),
    Mutant("key_from_row_id",
           "the effect's idempotency key is its outbox row's id, which a power cut that loses "
           "the row frees for another effect", ("effects-complete",),
           "mutants/power-loss-normal"),
)

BY_NAME: dict[str, Mutant] = {m.name: m for m in CATALOG}

#: Mutants whose mechanism, or the harm it does, has no counterpart on PostgreSQL, with the
#: reason: they run on SQLite alone, and `--backend postgres` refuses them
#: (chaos.run.backends.check_backend) rather than run what is there the reference engine
#: under a mutant's name. Every mutant of the store removes its mechanism from each
#: backend's own SQL or methods (chaos.reference.mutants.patches).
SQLITE_ONLY: dict[str, str] = {
    "group_stale_fails_all": "group commit is SQLite's: on PostgreSQL each slot commits on its "
                             "own connection, the server grouping their flushes",
    "key_from_row_id": "its harm needs a row id given again after a power cut: PostgreSQL's "
                       "identity column is a sequence, WAL-logged 32 values ahead, that skips "
                       "on after a cut and never gives a lost row's id to another row",
}
#: The mutants that run on PostgreSQL too.
ON_POSTGRES = frozenset(m.name for m in CATALOG if m.name not in SQLITE_ONLY)


class MutantEngine(ReferenceEngine):
    """The reference engine's adapter, whose processes run patched as mutant `mutant.name`."""

    def __init__(self, mutant: Mutant) -> None:
        super().__init__()
        self.mutant = mutant
        self.name = f"mutant:{mutant.name}"
        if mutant.name in SQLITE_ONLY:
            self.backends = ("sqlite",)
            self.backend_note = SQLITE_ONLY[mutant.name]

    def command(self, role: str, ctx: ProcessContext) -> Command:
        """The reference's command, run through `python -m chaos.reference.mutants NAME`."""
        command = ReferenceEngine.command(self, role, ctx)
        module_end = command.argv.index(self.module) + 1
        return Command([sys.executable, "-m", "chaos.reference.mutants", self.mutant.name,
                        *command.argv[module_end:]], command.env)


class ReplacingSubmit(MutantEngine):
    """Submission replaces an existing job; the workers are the reference's."""

    def command(self, role: str, ctx: ProcessContext) -> Command:
        return ReferenceEngine.command(self, role, ctx)

    def submit(self, db: str, job_id: str, payload: Any) -> str:
        store = self._store(db)
        # this call only: the reference's insert turned into a replace (sql_edits)
        edit_store_sql(store, sql_edits(store.backend)["submit_replaces"])
        return self.submit_with(store, job_id, payload)


class UnwrittenOperator(MutantEngine):
    """Operator actions (the adapter's own control, in the harness process) report done
    without writing the job; the workers are the reference's."""

    def command(self, role: str, ctx: ProcessContext) -> Command:
        return ReferenceEngine.command(self, role, ctx)

    def operator(self, db: str, action: str, job_id: str) -> str:
        store = self._store(db)
        # This store only, never the class: the harness runs operator actions on threads
        # of their own, and a class patched by one call would be seen by every other, and
        # by the runs this process makes next.
        operator_move_not_written(store)
        return self.operate_with(store, action, job_id)


#: Mutants whose change lives in the adapter's own controls, not in its processes.
CONTROL_MUTANTS = {"submit_replaces": ReplacingSubmit,
                   "operator_move_not_written": UnwrittenOperator}

ENGINES: dict[str, MutantEngine] = {
    m.name: CONTROL_MUTANTS.get(m.name, MutantEngine)(m) for m in CATALOG}
