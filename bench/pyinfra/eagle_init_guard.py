"""The eagle-init-guard hot fix as a pyinfra deploy (the benchmark's tool c).

Run by the harness as `pyinfra inventory_N.py bench/pyinfra/eagle_init_guard.py -y --parallel N
--data phase=full|patch --data poll_delay=1`. Per host, as the Ansible playbook does: back up
the file, insert the two lines (`files.block`), validate with the host's engine interpreter,
restart the engine (the inventory's restart_script), wait for /health, smoke-decode (greedy, 16
tokens, spec_verify_ct > 0). pyinfra has no `rescue`: every step after the edit restores the
backup (and restarts the engine) itself when it fails, then fails the host.

Host data (from the inventory the harness writes): target_file, engine_python, engine_port,
restart_script.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.operations import files, server

phase = str(host.data.get("phase", "full"))
poll_delay = float(host.data.get("poll_delay", 1))
target = str(host.data.target_file)
backup = target + ".bak"
python = str(host.data.engine_python)
port = int(host.data.engine_port)
restart = str(host.data.restart_script)
prompts = ("The capital of France is", "def fibonacci(n):")

# On failure after the edit: put the backup back, restart on it (full pipeline), fail the host.
rollback = f"cp -p {shlex.quote(backup)} {shlex.quote(target)}"
if phase == "full":
    rollback += f"; {restart}"
on_failure = f" || {{ {rollback}; exit 1; }}"

health = (
    f"i=0; until curl -sf -o /dev/null http://127.0.0.1:{port}/health; do "
    f"i=$((i+1)); [ $i -gt 600 ] && exit 1; sleep {poll_delay:g}; done"
)

server.shell(
    name="back up the file",
    commands=[f"cp -p {shlex.quote(target)} {shlex.quote(backup)}"],
)

files.block(
    name="class-level default",
    path=target,
    line=r"^class EAGLEWorkerV2\(",
    after=True,
    content="    spec_disable_batch_threshold: int = 0",
    marker="    # {mark} eagle-init-guard class default",
)

files.block(
    name="assignment before the calls that can fail",
    path=target,
    line=r"^        self\.speculation_disabled = False$",
    after=True,
    content="        self.spec_disable_batch_threshold = 0",
    marker="        # {mark} eagle-init-guard early assignment",
)

server.shell(
    name="validate with the host's interpreter",
    commands=[f"{shlex.quote(python)} -m py_compile {shlex.quote(target)}{on_failure}"],
)

if phase == "full":
    server.shell(
        name="restart the engine",
        commands=[f"( {restart} ){on_failure}"],
    )
    server.shell(
        name="wait for /health",
        commands=[f"( {health} ){on_failure}"],
    )
    check = (
        "import json, sys; m = json.load(sys.stdin)['meta_info']; "
        "sys.exit(0 if m.get('completion_tokens') and m.get('spec_verify_ct') else 1)"
    )
    smoke = []
    for prompt in prompts:
        body = json.dumps(
            {"text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
        )
        smoke.append(
            f"( curl -sf -X POST -H 'Content-Type: application/json' -d {shlex.quote(body)} "
            f"http://127.0.0.1:{port}/generate | {shlex.quote(python)} -c {shlex.quote(check)} )"
            + on_failure
        )
    server.shell(name="smoke decode", commands=smoke)
