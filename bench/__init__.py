"""Benchmarks of pipeplan; ``python -m bench`` runs them all (see bench/suite.py)."""
