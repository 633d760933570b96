"""OpenAI-shaped endpoints (`/v1/completions`, `/v1/chat/completions`, `/v1/models`).

Requests are translated into the native generate request, so validation and decoding are the same
code as `/generate`; responses follow the OpenAI shapes (`choices`, `usage`). Unknown request
fields are ignored, as OpenAI-compatible servers commonly do.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from sglang.srt.managers.tokenizer_manager import BadRequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs

DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 128
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "stop", "seed")


def error_response(message: str, status: int = 400) -> dict[str, Any]:
    return {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": status,
    }


def _sampling_params(body: dict[str, Any], max_tokens_default: int) -> dict[str, Any]:
    if body.get("n", 1) != 1:
        raise BadRequestError("n must be 1 (the stand-in returns one choice)")
    if body.get("stream"):
        raise BadRequestError("stream=true is not supported by the stand-in engine")
    if body.get("logprobs"):
        raise BadRequestError("logprobs are not supported by the stand-in engine")
    params: dict[str, Any] = {
        name: body[name] for name in _SAMPLING_FIELDS if body.get(name) is not None
    }
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    params["max_new_tokens"] = max_tokens_default if max_tokens is None else max_tokens
    return params


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finish_reason(output: dict[str, Any]) -> dict[str, Any]:
    reason = output["meta_info"]["finish_reason"]
    return {
        "finish_reason": reason.get("type"),
        "matched_stop": reason.get("matched"),
    }


def _usage(outputs: list[dict[str, Any]]) -> dict[str, int]:
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outputs)
    completion = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completions(
    body: Any, tokenizer_manager: TokenizerManager, server_args: ServerArgs
) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequestError("prompt is required")
    native: dict[str, Any] = {
        "sampling_params": _sampling_params(body, DEFAULT_COMPLETION_MAX_TOKENS)
    }
    if isinstance(prompt, str):
        native["text"] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        native["text"] = prompt
    elif isinstance(prompt, list) and prompt and all(_is_token_id(p) for p in prompt):
        native["input_ids"] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        native["input_ids"] = prompt
    else:
        raise BadRequestError(
            "prompt must be a string, a list of strings, a list of token ids, or a list of those"
        )
    request = tokenizer_manager.parse_generate_request(native)
    request.is_single = False
    outputs = tokenizer_manager.generate(request)
    assert isinstance(outputs, list)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": server_args.served_model_name,
        "choices": [
            {"index": index, "text": output["text"], "logprobs": None, **_finish_reason(output)}
            for index, output in enumerate(outputs)
        ],
        "usage": _usage(outputs),
    }


def chat_prompt(messages: Any) -> str:
    """A plain chat template: `<|role|>` headers, then the assistant header to continue from."""
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("messages must be a non-empty list")
    parts = []
    for message in messages:
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise BadRequestError("each message needs a string role and a string content")
        parts.append(f"<|{message['role']}|>\n{message['content']}\n")
    return "".join(parts) + "<|assistant|>\n"


def chat_completions(
    body: Any, tokenizer_manager: TokenizerManager, server_args: ServerArgs
) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    native = {
        "text": chat_prompt(body.get("messages")),
        "sampling_params": _sampling_params(body, DEFAULT_CHAT_MAX_TOKENS),
    }
    output = tokenizer_manager.generate(tokenizer_manager.parse_generate_request(native))
    assert isinstance(output, dict)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": server_args.served_model_name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": output["text"]},
                **_finish_reason(output),
            }
        ],
        "usage": _usage([output]),
    }


def models(server_args: ServerArgs, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": server_args.served_model_name,
                "object": "model",
                "created": created,
                "owned_by": "sglang",
                "root": server_args.model_path,
                "max_model_len": server_args.context_length,
            }
        ],
    }
