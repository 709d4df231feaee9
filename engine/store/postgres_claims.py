"""The PostgreSQL store's claim statements, each one statement so that the lock, the choice
and the lease are one step: a job's (lease it, or past max_claims park it as a crash loop)
and an outbox row's (lease it, or past max_attempts dead-letter it); and the clock every
statement writes with."""
from __future__ import annotations


#: The clock every statement writes with: the server's (statement_timestamp(), one value
#: for the whole statement) plus 0, or 0 plus the caller's `now`. Absolute times the caller
#: gives (a retry_at) are sent as offsets from its `now` in the first case (see `_params`).
CLOCK = ("(CASE WHEN %(db_clock)s THEN extract(epoch FROM statement_timestamp())::float8"
         " ELSE 0 END)")


NOW = f"({CLOCK} + %(now)s)"


#: The job claim: lock the due job (skipping one another claimer holds), and in the same
#: statement either lease it (bump the token, move a ready job to its working state) or,
#: past max_claims for its step, park it as a crash loop (the token is bumped there too, so
#: the last holder is fenced out). Returns the job's memos with it.
CLAIM_JOB = f"""
WITH due AS (
  SELECT id, state, claims FROM job
  WHERE pipeline = %(pipeline)s AND next_run_at IS NOT NULL AND next_run_at <= {NOW}
  ORDER BY next_run_at LIMIT 1
  FOR UPDATE SKIP LOCKED
), step AS (
  SELECT * FROM unnest(%(ready)s::text[], %(working)s::text[], %(parked)s::text[],
                       %(label)s::text[]) AS s(ready, working, parked, label)
), pick AS (
  SELECT due.id, step.working, step.parked, step.label,
         CASE WHEN due.state = step.ready THEN 0 ELSE due.claims END AS before
  FROM due JOIN step ON due.state IN (step.ready, step.working)
)
UPDATE job SET
  state = CASE WHEN pick.before < %(max_claims)s THEN pick.working ELSE pick.parked END,
  claims = CASE WHEN pick.before < %(max_claims)s THEN pick.before + 1 ELSE job.claims END,
  lease_until = CASE WHEN pick.before < %(max_claims)s THEN {NOW} + %(lease)s ELSE 0 END,
  next_run_at = CASE WHEN pick.before < %(max_claims)s THEN {NOW} + %(lease)s END,
  lease_owner = CASE WHEN pick.before < %(max_claims)s THEN %(worker)s END,
  lease_token = job.lease_token + 1,
  last_error = CASE WHEN pick.before < %(max_claims)s THEN job.last_error
    ELSE 'crash loop: step ' || pick.label || ' was claimed ' || pick.before
         || ' times without finishing; parked' END,
  updated_by = %(worker)s, updated = {NOW}
FROM pick WHERE job.id = pick.id
RETURNING job.id, job.state, job.claims, job.attempts, job.lease_token, job.payload,
  pick.before < %(max_claims)s,
  (SELECT COALESCE(json_object_agg(r.step, r.output), '{{}}'::json) FROM step_result r
   WHERE r.job_id = job.id)
"""


#: The outbox claim, likewise: lease the due row, or dead-letter it past max_attempts.
CLAIM_OUTBOX = f"""
WITH due AS (
  SELECT id FROM outbox
  WHERE sent_at IS NULL AND dead_at IS NULL AND next_attempt_at <= {NOW}
  ORDER BY next_attempt_at LIMIT 1
  FOR UPDATE SKIP LOCKED
)
UPDATE outbox SET
  attempts = CASE WHEN outbox.attempts < %(max_attempts)s THEN outbox.attempts + 1
             ELSE outbox.attempts END,
  dead_at = CASE WHEN outbox.attempts >= %(max_attempts)s THEN {NOW} END,
  lease_until = CASE WHEN outbox.attempts < %(max_attempts)s THEN {NOW} + %(lease)s ELSE 0 END,
  next_attempt_at = CASE WHEN outbox.attempts < %(max_attempts)s THEN {NOW} + %(lease)s
                    ELSE outbox.next_attempt_at END,
  lease_owner = CASE WHEN outbox.attempts < %(max_attempts)s THEN %(sender)s END,
  lease_token = outbox.lease_token + 1,
  last_error = CASE WHEN outbox.attempts < %(max_attempts)s THEN outbox.last_error
    ELSE COALESCE(outbox.last_error, '') || ' [dead-lettered after ' || outbox.attempts
         || ' attempts]' END,
  updated_by = %(sender)s
FROM due WHERE outbox.id = due.id
RETURNING outbox.id, outbox.job_id, outbox.kind, outbox.payload, outbox.idempotency_key,
  outbox.lease_token, outbox.attempts, outbox.dead_at IS NULL
"""
