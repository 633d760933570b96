"""The judgments: pure functions from facts already read to what they mean.

Lives here: what `diagnose` read, judged (`findings`) and its text (`diagnosis_text`), whether a
change was proven (`proof`), where a host's files stand (`patchset`: each file placed once, a
change's standing) and the words each command says about it (`views`: a table per word), who
ran a run (`who`), whether a patch's approval verifies (`approval`) and whether a unit's nodes
are uniform (`units`).

May import the layers below `opspatch.runs`; never `opspatch.runs.fleet` nor a command.
"""
