"""The document pipeline written the way DBOS's documentation teaches it, and its adapter."""
