"""opspatch: safe, structural hot fixes for live SGLang inference fleets.

The pure core (spec, anchors, edit, validate, inventory, playbook) never touches disk or network;
effects (transport, remote, engine, ledger, cli) sit at the edge and take their transport as an
argument.
"""

__version__ = "0.1.0"
