"""Runs as data and as work: the SQLite run store (schema, records, ownership and recovery), a
run as a table row, the shared training loop, background runs and sweeps."""
