"""The SQLite schema and its forward migrations, versioned by PRAGMA user_version."""
from __future__ import annotations

SCHEMA_VERSION = 1

#: MIGRATIONS[v] takes a database from user_version v to v + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE job (
          id          TEXT PRIMARY KEY,          -- the caller's idempotency key
          pipeline    TEXT NOT NULL,
          state       TEXT NOT NULL,
          payload     TEXT NOT NULL,             -- canonical JSON input
          result      TEXT,                      -- JSON output of the last step
          attempts    INTEGER NOT NULL DEFAULT 0,  -- failed attempts at the current step
          claims      INTEGER NOT NULL DEFAULT 0,  -- claims of the current step (crash-loop bound)
          next_run_at REAL,                      -- when a worker may claim it: retry time when
                                                 -- ready, lease expiry when working, NULL when
                                                 -- terminal or parked (kept out of the index)
          lease_until REAL NOT NULL DEFAULT 0,
          lease_owner TEXT,
          lease_token INTEGER NOT NULL DEFAULT 0,  -- fencing counter, bumped by every claim
          last_error  TEXT,
          updated_by  TEXT,
          created     REAL NOT NULL,
          updated     REAL NOT NULL
        )
        """,
        # The claim is an index seek over claimable jobs only; finished jobs stay in the
        # table (they are the cost report) but not in this index.
        "CREATE INDEX job_claim ON job(pipeline, next_run_at) WHERE next_run_at IS NOT NULL",
        """
        CREATE TABLE step_result (               -- the memo: a committed step is never redone
          job_id      TEXT NOT NULL,
          step        TEXT NOT NULL,
          output      TEXT NOT NULL,
          cost        REAL NOT NULL DEFAULT 0,
          at          REAL NOT NULL,
          worker      TEXT,
          lease_token INTEGER,
          PRIMARY KEY (job_id, step)
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE outbox (                    -- side effects, sent at least once, keyed
          id              INTEGER PRIMARY KEY,
          job_id          TEXT NOT NULL,
          kind            TEXT NOT NULL,
          payload         TEXT NOT NULL,
          idempotency_key TEXT NOT NULL,
          sent_at         REAL,
          dead_at         REAL,                  -- dead-lettered past the attempt cap
          attempts        INTEGER NOT NULL DEFAULT 0,
          next_attempt_at REAL NOT NULL DEFAULT 0, -- retry time, or lease expiry while leased
          lease_until     REAL NOT NULL DEFAULT 0,
          lease_owner     TEXT,
          lease_token     INTEGER NOT NULL DEFAULT 0,
          last_error      TEXT,
          updated_by      TEXT,
          created         REAL NOT NULL,
          UNIQUE (job_id, kind)
        )
        """,
        "CREATE INDEX outbox_due ON outbox(next_attempt_at) WHERE sent_at IS NULL AND dead_at IS NULL",
        """
        CREATE TABLE spend (                     -- every billed call, committed or wasted
          id          INTEGER PRIMARY KEY,
          job_id      TEXT NOT NULL,
          step        TEXT NOT NULL,
          worker      TEXT NOT NULL,
          lease_token INTEGER,
          started     REAL NOT NULL,
          ended       REAL NOT NULL,
          outcome     TEXT NOT NULL,             -- ok | retryable | poison | lease_lost
          cost        REAL,                      -- NULL when the provider did not say
          error       TEXT
        )
        """,
    ),
)
