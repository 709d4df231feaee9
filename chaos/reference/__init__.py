"""The reference engine's adapter, its audit triggers and its observer (see `adapter`)."""
from chaos.reference.adapter import REFERENCE, ReferenceEngine, backoff_bounds, chaos_pipeline

__all__ = ["REFERENCE", "ReferenceEngine", "backoff_bounds", "chaos_pipeline"]
