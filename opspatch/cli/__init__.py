"""The command line (typer): parses arguments, asks for confirmation, calls one function per
command and prints what it returns. Kept light: importing it imports no SSH library or torch."""

from __future__ import annotations

from opspatch.cli.app import main

__all__ = ["main"]
