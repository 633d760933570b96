"""The run engine: how any command runs over hosts, written once."""
