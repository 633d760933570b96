"""The sandbox: a local fleet of SGLang engines on one machine, the stand-in or real SGLang on
the CPU (`real/`: its cached environment, CPU kernel layer, models and launch).

`engine_src/sglang/` is the stand-in engine (package data, copied into each sandbox host; it is
never importable from the controller). `install.py` installs it into a host's own virtual
environment in one of two shapes: like a wheel (`dist.py` holds what both share), or as a git
checkout installed editable (`checkout.py`, as on the incident's host). `sshd.py` starts private
OpenSSH servers for the hosts, and `fleet.py` is the front door of `up`, `status` and `down`
(`layout`, `manifest`, `plan`, `processes`, `up`, `status`, `down`), which also write the
inventories. `rehearse.py` runs `opspatch rehearse` on a throwaway real-engine sandbox
(`rehearsal.py`: its stages, pure).

May import: `opspatch.runs`, `opspatch.hosts`, `opspatch.config`, `opspatch.core` and
`opspatch.errors`; not the CLI (the `opspatch sandbox` commands live in `opspatch.cli.sandbox`).
"""

MAX_HOSTS = 32
"""Most hosts one sandbox holds (loopback addresses 127.0.0.2 and up, one engine each)."""
