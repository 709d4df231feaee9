"""What the documentation's generated pages (`chaos.docs`) show of the reference engine,
read from the engine itself: its command line's parser, its settings with their defaults
and meanings, and its crash points as the engine declares them."""
from __future__ import annotations

import argparse
import inspect


def engine_parser() -> argparse.ArgumentParser:
    """`ninelives engine`'s argument parser."""
    from engine.cli import build_parser
    return build_parser()


def settings() -> list[tuple[str, str, str]]:
    """(name, its default as a page shows it, what it is) of every engine setting."""
    from engine.config import DEFAULT_WORDS, MEANING, EngineConfig
    config = EngineConfig()
    return [(name, DEFAULT_WORDS.get(name) or f"`{getattr(config, name, '')!r}`", text)
            for name, text in MEANING.items()]


def crashpoints_source() -> list[str]:
    """The lines of engine.hooks that declare the crash points, with their comments."""
    from engine import hooks
    source = inspect.getsource(hooks)
    start = source.index("CRASHPOINTS: tuple[str, ...] = (")
    return source[start:source.index(")\n", start) + 1].splitlines()
