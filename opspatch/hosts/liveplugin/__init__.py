"""opspatch's SGLang plugin: the delivery path of live fixes into every process of a running
engine. Installed into the engine's environment as its own distribution, `opspatch_live`
(`opspatch.hosts.livedist` builds it), and loaded by SGLang's plugin framework in every process.

One concern per module:
- `socket_paths`: where each engine process's socket is, and whether the engine loads the plugin
  (pure; the controller and the host agent compute the same paths);
- `wire`: one JSON line per request and per reply, and the client that asks a socket;
- `listener`: the Unix socket of one process (its directory, the peer's uid, one thread);
- `boundary`: the scheduler's side: a take or revert queued on the entry rank, injected at the
  next scheduling boundary as an `RpcReqInput`, applied by every rank, then the barrier;
- `plugin`: `load()`, the entry point SGLang calls in every process (and the `.pth` start);
- `fixes`: what a live fix does in one process (`take`, `revert`, `list`);
- `checks`: the preflight's `check`, whether a take would be in effect here (nothing changed);
- `importtime`: where a module's source reads a name while it is imported (pure).

Rules for every module here, because they run inside engines we do not control: Python 3.8+ and
the standard library only (`from __future__ import annotations` keeps hints as strings); import
nothing from opspatch outside this package, and each other only relatively (`from . import x`),
so the package works under either name; never import the engine or torch at module level.
"""

from __future__ import annotations
