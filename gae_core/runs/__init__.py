"""Runs as work: the one run loop (``execute``), what a run reports and the sinks that carry it
(``sinks``), sweeps on their backends (``sweep``, ``pool``, ``ray_pool``, ``gather``,
``backends``) and the dashboard's runs, each a sweep of one (``manager``). What is stored lives
in ``gae_core.storage``."""
