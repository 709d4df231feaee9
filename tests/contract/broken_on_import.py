"""An adapter module that raises when imported (see broken_adapters)."""
raise RuntimeError("broken import on purpose")
