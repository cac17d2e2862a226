"""Bench: agent configs, runs, the harness, the perception gateway and the scorer."""
