"""An engine with a queue's semantics (Amazon SQS): one task row per step, received with a
random receipt handle that fences its holder, a visibility timeout for a lease, one receive
count bounding retries and crashes together. Its adapter: `examples.sqs_engine.adapter:SQS`."""
