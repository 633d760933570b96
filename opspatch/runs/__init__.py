"""Runs: what opspatch does to a fleet, built from host operations and recorded in the ledger."""
