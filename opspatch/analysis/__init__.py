"""Pure analyses for incident response and patch authors: code in, findings out, no I/O.

Lives here: the class model shared by the analyses (`classgraph`), partial-initialisation hazards
and the guard patch that fixes them (`initlint`, `guarddefault`: `opspatch lint-init`), the
diagnosis of a missing attribute and of how far an `__init__` got by its log messages
(`missingattr`, `initprogress`), which workspace patch fixes an exception (`fixes`), a patch's
portability over releases (`portability`: `check --releases`), and an upstreamable diff or mail
(`export`).

May import: `opspatch.core` and `opspatch.errors`. Fetching releases, reading hosts and printing
belong to `opspatch.runs` and `opspatch.cli`.
"""
