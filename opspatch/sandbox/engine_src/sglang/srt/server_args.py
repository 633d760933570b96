"""Server arguments: one dataclass, its command-line flags, and their validation.

Flag names follow SGLang (`--model-path`, `--speculative-algorithm`, ...); the subset is what the
stand-in uses, plus a few common deployment flags that are accepted and recorded so that real
start commands keep working (`--mem-fraction-static`, `--trust-remote-code`).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NONE")


@dataclass
class ServerArgs:
    # Model and tokenizer
    model_path: str = "tiny"
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    context_length: int = 1024
    trust_remote_code: bool = False

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    skip_server_warmup: bool = False

    # Runtime
    device: str = "cpu"
    tp_size: int = 1
    # Multi-node: the TP ranks spread over `nnodes` nodes, `tp_size // nnodes` scheduler
    # processes on each; rank 0's node (node rank 0) serves HTTP.
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    # Seconds a torch.distributed collective (and joining the group) waits; None: torch's own.
    dist_timeout: int | None = None
    # Seconds one scheduler step may take before the scheduler's watchdog ends the server.
    watchdog_timeout: float = 300.0
    mem_fraction_static: float | None = None
    max_running_requests: int = 64
    page_size: int = 1
    random_seed: int | None = None
    disable_cuda_graph: bool = False
    attention_backend: str = "torch_native"

    # Speculative decoding
    speculative_algorithm: str | None = "EAGLE3"
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    # Local feature of the incident's build: above this many running requests, decode without
    # speculation (0 = never disable).
    spec_disable_batch_threshold: int = 0

    # Logging
    log_level: str = "info"
    log_file: str | None = None
    decode_log_interval: int = 40

    def __post_init__(self) -> None:
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        algorithm = (self.speculative_algorithm or "NONE").upper()
        if algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(
                f"unknown speculative algorithm {self.speculative_algorithm!r}; "
                f"choose one of {', '.join(SPECULATIVE_ALGORITHMS)}"
            )
        if algorithm == "NEXTN":
            algorithm = "EAGLE"
        self.speculative_algorithm = algorithm
        if algorithm != "NONE":
            if self.speculative_draft_model_path is None:
                self.speculative_draft_model_path = f"{self.model_path}-draft"
            if self.speculative_eagle_topk != 1:
                raise ValueError("the stand-in engine supports --speculative-eagle-topk 1 only")
            if self.speculative_num_steps < 1:
                raise ValueError("--speculative-num-steps must be at least 1")
            # With topk=1 the draft tree is a chain: num_steps drafts plus the verified token.
            self.speculative_num_draft_tokens = self.speculative_num_steps + 1
        if self.spec_disable_batch_threshold < 0:
            raise ValueError("--spec-disable-batch-threshold must be 0 (never) or positive")
        if self.tp_size < 1:
            raise ValueError("--tp-size must be at least 1")
        if self.nnodes < 1:
            raise ValueError("--nnodes must be at least 1")
        if self.tp_size % self.nnodes:
            raise ValueError(
                f"--tp-size {self.tp_size} must be a multiple of --nnodes {self.nnodes}"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("--nnodes above 1 needs --dist-init-addr HOST:PORT (node 0's address)")
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(f"--dist-init-addr must be HOST:PORT, got {self.dist_init_addr!r}")
        if self.dist_timeout is not None and self.dist_timeout < 1:
            raise ValueError("--dist-timeout must be at least 1 (seconds)")
        if self.watchdog_timeout <= 0:
            raise ValueError("--watchdog-timeout must be positive (seconds)")
        if self.device != "cpu":
            raise ValueError("the stand-in engine decodes on the CPU only (--device cpu)")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        if self.context_length < 8:
            raise ValueError("--context-length must be at least 8")
        if self.max_running_requests < 1:
            raise ValueError("--max-running-requests must be at least 1")

    def url(self) -> str:
        """The base URL clients of this server use (a wildcard bind is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def tp_size_per_node(self) -> int:
        return self.tp_size // self.nnodes

    def node_tp_ranks(self) -> range:
        """The TP ranks whose scheduler processes run on this node."""
        per_node = self.tp_size_per_node
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        defaults = ServerArgs.__dataclass_fields__
        d = {name: f.default for name, f in defaults.items()}
        parser.add_argument("--model-path", "--model", type=str, default=d["model_path"])
        parser.add_argument("--tokenizer-path", type=str, default=d["tokenizer_path"])
        parser.add_argument("--served-model-name", type=str, default=d["served_model_name"])
        parser.add_argument("--context-length", type=int, default=d["context_length"])
        parser.add_argument("--trust-remote-code", action="store_true")
        parser.add_argument("--host", type=str, default=d["host"])
        parser.add_argument("--port", type=int, default=d["port"])
        parser.add_argument("--skip-server-warmup", action="store_true")
        parser.add_argument("--device", type=str, default=d["device"])
        parser.add_argument("--tp-size", "--tp", type=int, default=d["tp_size"])
        parser.add_argument("--nnodes", type=int, default=d["nnodes"])
        parser.add_argument("--node-rank", type=int, default=d["node_rank"])
        parser.add_argument("--dist-init-addr", type=str, default=d["dist_init_addr"])
        parser.add_argument("--dist-timeout", type=int, default=d["dist_timeout"])
        parser.add_argument("--watchdog-timeout", type=float, default=d["watchdog_timeout"])
        parser.add_argument("--mem-fraction-static", type=float, default=d["mem_fraction_static"])
        parser.add_argument("--max-running-requests", type=int, default=d["max_running_requests"])
        parser.add_argument("--page-size", type=int, default=d["page_size"])
        parser.add_argument("--random-seed", type=int, default=d["random_seed"])
        parser.add_argument("--disable-cuda-graph", action="store_true")
        parser.add_argument("--attention-backend", type=str, default=d["attention_backend"])
        parser.add_argument(
            "--speculative-algorithm",
            type=str,
            default=d["speculative_algorithm"],
            help=f"one of {', '.join(SPECULATIVE_ALGORITHMS)}",
        )
        parser.add_argument(
            "--speculative-draft-model-path", type=str, default=d["speculative_draft_model_path"]
        )
        parser.add_argument("--speculative-num-steps", type=int, default=d["speculative_num_steps"])
        parser.add_argument(
            "--speculative-eagle-topk", type=int, default=d["speculative_eagle_topk"]
        )
        parser.add_argument(
            "--speculative-num-draft-tokens",
            type=int,
            default=d["speculative_num_draft_tokens"],
        )
        parser.add_argument(
            "--spec-disable-batch-threshold",
            type=int,
            default=d["spec_disable_batch_threshold"],
            help="decode without speculation above this many running requests (0 = never)",
        )
        parser.add_argument("--log-level", type=str, default=d["log_level"])
        parser.add_argument("--log-file", type=str, default=d["log_file"])
        parser.add_argument("--decode-log-interval", type=int, default=d["decode_log_interval"])

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: getattr(args, name) for name in names})


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """Parse the command line into ServerArgs; a bad flag or value exits 2 with a message."""
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    try:
        return ServerArgs.from_cli_args(args)
    except ValueError as error:
        parser.error(str(error))
        raise  # parser.error exits; this line keeps type checkers satisfied
