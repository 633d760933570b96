"""Runs: what opspatch does to a fleet, built from host operations and recorded in the ledger.

Lives here: one host within a run (`session`: its transport, operations, engine control and the
step recorder) and the steps runs share (`steps`); the fleet executor (`executor`: batches,
in-flight limit, halt policy, Ctrl-C); the ledger ceremony (`recorded`); what a run reports
(`report`); the per-host apply pipeline (`pipeline`) and the fleet apply (`apply`), rollback (`restore`), recover and unlock (`recover`), runs on a
local file (`localfile`), the smoke decode alone (`smoke`), live status (`status`), a fleet's
desired patches against what is there (`sync`: `plan --fleet`, `sync`, `drift`), the release
matrix's fetching (`releases`), and how transports are opened (`connect`). Incident response:
`diagnose` (one read per host, judged against RECORD, git and the ledger; also the read behind
`lint-init --hosts`), `findings` (the judging, pure) and `diagnosis_text` (its text), `adopt` (a
hand edit becomes a patch and a recorded run), `timeline` (the postmortem `ledger report`).

May import: `opspatch.hosts`, `opspatch.ledger`, `opspatch.config`, `opspatch.analysis`,
`opspatch.core` and `opspatch.errors`. Never the CLI: every run returns a report value, and
printing it is the CLI's.
"""
