"""A toy durable engine with another shape than the reference: one SQLite table of JSON
documents, no fencing token, a two-step pipeline (summarize, publish). Its adapter to the
harness contract is `examples.toy_engine.adapter:TOY`."""
