"""The opspatch host agent: the code that runs ON a host, under the engine's own interpreter.

Python 3.8+ and the standard library only, never the engine or torch: it runs on hosts we do not
control. How it travels, and the module of each concern: docs/agent.md, "The agent's modules".
"""

MODULES = (
    "protocol",
    "fsutil",
    "checks",
    "locks",
    "files",
    "processes",
    "restarts",
    "facts",
    "engine",
    "measure",
    "provenance",
    "diagnose",
    "live",
    "liveinstall",
    "dispatch",
)
"""The agent's modules in the order a host executes them: each imports only earlier ones, and
the last (`dispatch`) holds `main`."""
