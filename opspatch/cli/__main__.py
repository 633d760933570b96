"""`python -m opspatch.cli`: the console script, for tests and hosts without the entry point."""

from opspatch.cli import main

main()
