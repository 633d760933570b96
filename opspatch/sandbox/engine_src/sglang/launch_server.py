"""Launch the server: `python -m sglang.launch_server --port P [--host H] [flags]`."""

import sys

if __name__ == "__main__":
    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sys.argv[1:])
    launch_server(server_args)
