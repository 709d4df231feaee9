"""ninelives' reference engine: multi-step workflows on SQLite that survive a crash at any line.

The public surface: the state table and pipelines, the store, the worker and the outbox
sender, settings, and the test hooks (crash points, clocks).
"""
from .interrupts import quiet_when_a_command

quiet_when_a_command("engine")  # first: `python -m engine` interrupted while it imports

from .config import ConfigError, EngineConfig, load_config
from .hooks import CRASHPOINTS, Clock, ManualClock, SkewedClock, SystemClock, crashpoint
from .outbox import Sender
from .retry import (Backoff, CallTimeout, ParseError, PoisonError, RetryableError, SchemaError,
                    StepError, classify)
from .states import (DOCUMENT, STATES, IllegalTransition, Pipeline, PipelineError, Step,
                     build_pipeline, get_pipeline, register_pipeline)
from .steps import CallResult, Conclusion, StepContext, StepRunner
from .store import (DatabaseError, Effect, LeaseLost, OperatorError, SQLiteStore, Store,
                    StoreBusy, SubmissionConflict, open_store)
from .slots import GroupCommit, Slots
from .worker import Worker, new_worker_id

__version__ = "0.1.0"

__all__ = [
    "Backoff", "CRASHPOINTS", "CallResult", "CallTimeout", "Clock", "Conclusion", "ConfigError",
    "DOCUMENT", "DatabaseError", "Effect", "EngineConfig", "GroupCommit", "IllegalTransition",
    "LeaseLost",
    "ManualClock", "OperatorError", "ParseError", "Pipeline", "PipelineError", "PoisonError",
    "RetryableError", "SQLiteStore", "STATES", "SchemaError", "Sender", "SkewedClock", "Slots",
    "Step",
    "StepContext", "StepError", "StepRunner", "Store", "StoreBusy", "SubmissionConflict", "SystemClock",
    "Worker", "build_pipeline", "classify", "crashpoint", "get_pipeline", "load_config",
    "new_worker_id", "open_store", "register_pipeline",
]
