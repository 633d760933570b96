"""The opspatch host agent: the code that runs ON a host, under the engine's own interpreter.

The controller never installs anything on a host. It runs `<engine python> -c RESIDENT` once
per host and user for a run (or `-c BOOTSTRAP` once per request, with `agent = "per-exec"`; see
`opspatch.hosts.channel`), and sends on stdin a JSON request per line carrying the source of the
modules of `MODULES` its operations need that the process does not have yet (in that order,
compressed: `channel.modules_for`), the operations' names and their arguments (bytes as base64).
The bootstrap registers each module in `sys.modules` under its real dotted name (this package
and its parents as empty stub packages, so nothing is ever imported from the host's disk under
these names), executes it, and calls the last one's `serve(request, load)` (or
`main(request)`), in `dispatch`. So the modules import each other with ordinary absolute imports
that work the same here, in tests and mypy, and on a host.

One concern per module:
- `protocol`: the operation registry and `OpFailure` (an expected refusal with a stable code);
- `fsutil`: exact bytes, atomic writes, the state folder;
- `checks`: pure functions on what an engine says (a /generate reply, a log, tracebacks);
- `locks`: the per-host lock; `files`: read, swap, restore, backups, bytecode, compile check;
- `processes`: /proc, finding and stopping process trees; `restarts`: the restart strategies;
- `facts`: facts (driver, metadata), resolve, inspect (with the running server);
- `engine`: readiness, the drain wait (`/v1/loads`) and the smoke decode;
- `measure`: the judge's timed greedy decodes of a prompt set (with top-k logprobs);
- `provenance`: where a module's code comes from (other copies, git checkout, bytecode);
- `diagnose`: one host's incident facts in one exec (`opspatch diagnose`, `lint-init --hosts`);
- `live`: the running engine's live-fix sockets, asked (`apply --live`, `live`, `status`);
- `liveinstall`: the live plugin's files written into and removed from the engine's environment;
- `dispatch`: `main`, the one reply line.

Rules for every module here, because they run on hosts we do not control: Python 3.8+ and the
standard library only (`from __future__ import annotations` keeps the type hints as strings, so
the modern spelling costs nothing at run time); never import the engine or torch; this file is
never sent to hosts, so nothing at run time may depend on it.
"""

MODULES = (
    "protocol",
    "fsutil",
    "checks",
    "locks",
    "files",
    "processes",
    "restarts",
    "facts",
    "engine",
    "measure",
    "provenance",
    "diagnose",
    "live",
    "liveinstall",
    "dispatch",
)
"""The agent's modules in the order a host executes them: each imports only earlier ones, and
the last (`dispatch`) holds `main`."""
