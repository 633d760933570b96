"""Launch the server: `python -m sglang.launch_server --port P [--host H] [flags]`.

See `sglang.srt.server_args` for the flags. Logs go to stderr (or `--log-file`); the process exits
0 on SIGTERM/SIGINT, 1 when the scheduler hits an exception or the warm-up fails, and 2 on a bad
command line.

Imports happen under `__main__` only: the engine's children are spawned, and each imports this
module again (as `__mp_main__`); it must not cost them the server's imports.

As SGLang 0.5.23's `launch_server.py`, the main process loads its plugins first, before its
arguments are parsed, its log is set up or the server's modules are imported: a plugin's log
lines there go nowhere, and it finds no scheduler or detokenizer module loaded.
"""

import sys

if __name__ == "__main__":
    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sys.argv[1:])
    launch_server(server_args)
