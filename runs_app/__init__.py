"""Executing and reviewing: runs, trials, the engine that runs them, the numbers, the pages."""
