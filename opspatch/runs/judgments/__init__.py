"""The judgments: pure functions from facts already read to what they mean.

Lives here: what `diagnose` read, judged (`findings`) and its text (`diagnosis_text`), whether a
change was proven (`proof`), where a patch set's files stand on a host (`patchset`), who ran a
run (`who`), whether a patch's approval verifies (`approval`), whether a unit's nodes are uniform (`units`), and where a host's files stand (`patchset`: the standings and the commands' tables).

May import the layers below `opspatch.runs`; never `opspatch.runs.fleet` nor a command.
"""
