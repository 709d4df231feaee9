"""A run of real processes and what it leaves: the runner's phases, the supervisor and its process
ownership, the nemesis, aimed holds, the store's backend and PostgreSQL server, the run folder's
records, saved runs read back, campaigns of seeds and their shards."""
