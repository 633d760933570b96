"""Launch the server: `python -m sglang.launch_server --port P [--host H] [flags]`.

See `sglang.srt.server_args` for the flags. Logs go to stderr (or `--log-file`); the process exits
0 on SIGTERM/SIGINT, 1 when the scheduler hits an exception or the warm-up fails, and 2 on a bad
command line.
"""

import sys
import warnings

# torch warns on import when NumPy is not installed; the stand-in never converts to NumPy, and
# the warning would break the SGLang log format operators (and log scans) rely on.
warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy")

from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.server_args import prepare_server_args

if __name__ == "__main__":
    server_args = prepare_server_args(sys.argv[1:])
    launch_server(server_args)
