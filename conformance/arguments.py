"""argparse as every `python -m conformance` subcommand uses it: one-line errors, exit status 2."""
from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `python -m conformance run: error: ... (see --help)`, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
