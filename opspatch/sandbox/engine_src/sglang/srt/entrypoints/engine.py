"""The offline engine: the scheduler and tokenizer manager in-process, without HTTP.

`Engine(**server_args).generate(prompt, sampling_params)` returns what `/generate` would. Used to
drive the decoding path directly (for example to compare speculative and plain greedy output).
Like the server, a scheduler exception ends the process.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import configure_logger, install_sigquit_handler


class Engine:
    def __init__(self, log: bool = False, **kwargs: Any):
        self.server_args = ServerArgs(**kwargs)
        if log:
            configure_logger(self.server_args)
        install_sigquit_handler()
        self.scheduler = Scheduler(self.server_args)
        self.scheduler.start()
        self.tokenizer_manager = TokenizerManager(self.server_args, self.scheduler)
        self.tokenizer_manager.mark_up()

    def generate(
        self,
        prompt: None | str | list[str] = None,
        sampling_params: None | dict[str, Any] | list[dict[str, Any]] = None,
        input_ids: list[Any] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        body: dict[str, Any] = {"sampling_params": sampling_params}
        if prompt is not None:
            body["text"] = prompt
        if input_ids is not None:
            body["input_ids"] = input_ids
        request = self.tokenizer_manager.parse_generate_request(body)
        return self.tokenizer_manager.generate(request)

    def shutdown(self) -> None:
        self.scheduler.stop()
