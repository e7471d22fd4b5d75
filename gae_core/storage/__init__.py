"""Runs as data: the SQLite run store under one data folder (database, schema and migrations,
records, ownership and recovery, retention), a run and a sweep as table rows, and the lab's
stored measurements. It keeps bytes and records, never trainers: nothing here imports the agent
or the execution layer (``gae_core.runs``)."""
