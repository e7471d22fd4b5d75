"""Runs as work: the one run loop (``execute``), what a run reports and the sinks that carry it
(``sinks``), background runs for the dashboard (``manager``, ``child``) and sweeps on their
backends (``sweep``, ``pool``, ``ray_pool``, ``gather``, ``backends``). What is stored lives in
``gae_core.storage``."""
