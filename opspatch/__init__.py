"""opspatch: safe, structural hot fixes for live SGLang inference fleets."""

__version__ = "0.1.0"
