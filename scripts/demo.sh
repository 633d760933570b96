#!/usr/bin/env bash
# The main job on one machine, no GPU, no remote host: the incident and its fix on the sandbox.
#
#   install -> sandbox up (3 stand-in SGLang servers) -> they report healthy -> the first decode
#   crashes them (the incident) -> diagnose names the cause and the patch -> opspatch apply
#   eagle-init-guard -> decodes work -> status -> ledger.
#
# It installs opspatch (editable, with torch 2.13.0 for the CPU) into the environment of the first
# `python3` on PATH: activate a virtual environment first to keep it elsewhere.
# State (sandbox hosts, ledger) goes to $OPSPATCH_STATE_DIR, by default ./.demo-state, so the
# demo never touches your own sandbox or ledger. Running it again rebuilds the sandbox but keeps
# the ledger (the earlier runs stay listed); delete .demo-state to start from nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
export OPSPATCH_STATE_DIR="${OPSPATCH_STATE_DIR:-$PWD/.demo-state}"

step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "$2"; }

step "install into $(command -v python3) (torch 2.13.0 is a CPU build; a few minutes the first time)" \
     "python3 -m pip install torch==2.13.0 -e '.[sandbox]'"
python3 -m pip install --quiet --disable-pip-version-check torch==2.13.0 -e '.[sandbox]' || exit 1
echo "installed: $(command -v opspatch)"

echo "(removing the sandbox of an earlier demo run, if any; its ledger is kept)"
opspatch sandbox down --purge >/dev/null 2>&1 || true

step "a local fleet of three stand-in SGLang servers" "opspatch sandbox up"
opspatch sandbox up || exit 1

step "they report healthy, and carry no patch" "opspatch sandbox status"
opspatch sandbox status || exit 1

step "the incident: the first real decode crashes every server" "opspatch smoke --hosts sandbox"
opspatch smoke --hosts sandbox
echo "(exit $? as expected: the smoke decode failed)"
log="$OPSPATCH_STATE_DIR/sandbox/hosts/sandbox-01/server.log"
grep -m1 -B1 "AttributeError" "$log" || true

step "incident response: what the host really runs, and why it crashed" "opspatch diagnose --hosts sandbox-01"
opspatch diagnose --hosts sandbox-01
echo "(exit $?: the host is not clean)"

step "the fix, planned: a structural diff, per host" "opspatch plan eagle-init-guard --hosts sandbox-01"
opspatch plan eagle-init-guard --hosts sandbox-01 || exit 1

step "the fix, rolled out: canary first, then batches; restart, smoke decode, rollback on failure" \
     "opspatch apply eagle-init-guard --hosts sandbox --yes"
opspatch apply eagle-init-guard --hosts sandbox --yes || exit 1

step "decodes work, through speculative decoding" "opspatch smoke --hosts sandbox"
opspatch smoke --hosts sandbox || exit 1

step "the canary judge: tokens, speculation and latency against a baseline (here the same code)" \
     "opspatch judge --hosts sandbox-02 --baseline sandbox-01"
opspatch judge --hosts sandbox-02 --baseline sandbox-01
echo "(exit $?: 0 unless a metric failed)"

step "what is applied where, checked live against the ledger" \
     "opspatch status --hosts sandbox --patch eagle-init-guard"
opspatch status --hosts sandbox --patch eagle-init-guard || exit 1

step "every run is recorded, hash-chained" "opspatch ledger list && opspatch ledger verify"
opspatch ledger list && opspatch ledger verify || exit 1

cat <<TXT

The sandbox is still running. To continue by hand:
  export OPSPATCH_STATE_DIR=$OPSPATCH_STATE_DIR
  opspatch rollback eagle-init-guard --hosts sandbox --yes   # canary first: the incident's code is back, its decode crashes it, exit 1
  opspatch sandbox down --purge                              # stop the servers, remove the hosts
TXT
