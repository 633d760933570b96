"""A stand-in for SGLang, written for opspatch's sandbox (no SGLang code is copied).

It keeps SGLang's module paths where opspatch touches them (`sglang.launch_server`,
`sglang.srt.speculative.eagle_worker_v2`, `sglang.srt.managers.scheduler`, ...), its HTTP API
subset and its log format, and it reproduces the incident opspatch exists for. It decodes for real
with a tiny deterministic torch model on the CPU.

Package `__init__` files import nothing heavy: opspatch resolves target modules with
`importlib.util.find_spec`, which imports the parent packages.
"""

from sglang.version import __version__

__all__ = ["__version__"]
