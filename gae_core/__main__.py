"""``python -m gae_core``: the command line (see :mod:`gae_core.cli`)."""

from gae_core.cli import main

# Guarded: sweep workers start with "spawn", which imports the parent's main module.
if __name__ == "__main__":
    raise SystemExit(main())
