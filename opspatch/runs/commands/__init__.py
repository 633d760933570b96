"""The commands: one module per command that reads or changes hosts, named after it."""
