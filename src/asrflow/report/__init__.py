"""Comparing an experiment's systems: the table of ``asrflow compare`` and the report's plots."""
