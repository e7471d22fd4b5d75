"""The package's version: its one owner (``gae_core.__version__`` and the provenance of a
comparison's figures read it here; a test keeps pyproject's copy equal)."""

__version__ = "0.2.0"
