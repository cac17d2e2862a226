"""The `medomni` command line: a thin layer that parses arguments and calls the library."""

from medomni_cas.cli.main import main

__all__ = ["main"]
