"""Configuration files: finding them and loading them into the core's models.

Lives here: the one named-file lookup over the workspace, the state directory and the bundled
examples (`lookup`), the state and ledger locations (`paths`), playbook files (`playbook`) and
inventories (`inventory`: TOML and Ansible YAML, merging, the `--hosts` grammar).

May import: `opspatch.core` and `opspatch.errors`. Not hosts, ledger, runs or the CLI: loading a
file never touches a host.
"""
