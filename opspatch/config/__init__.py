"""Configuration files: finding them and loading them into the core's models.

Lives here: the one named-file lookup over the workspace, the state directory and the bundled
examples (`lookup`: `Workspace.find`, `load_patch`, `load_playbook`, `load_inventory`, `hosts`),
reading files (`files`), the state and ledger locations (`paths`), patch files (`patches`),
playbook files (`playbook`), the fleet file of desired patches (`fleet`) and inventories
(`inventory/`: TOML and Ansible YAML, merging, the `--hosts` grammar, what `inventory show`
prints). Every file is checked by a strict pydantic schema and reported by the core's one
translation (`opspatch.core.fileschema`).

May import: `opspatch.core` and `opspatch.errors`. Not hosts, ledger, runs or the CLI: loading a
file never touches a host.
"""
