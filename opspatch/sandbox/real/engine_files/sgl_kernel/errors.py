"""The one error of the CPU kernel layer: an op (or a case of one) it does not provide."""

from __future__ import annotations


class OpNotProvided(NotImplementedError, AttributeError):
    """`sgl_kernel.<op>` that opspatch's CPU layer lacks. An AttributeError too, so that
    `hasattr` and `from sgl_kernel import <op>` inside SGLang's own `try/except ImportError`
    guards see an absent op, as with a build of sgl-kernel that does not ship it."""

    def __init__(self, op: str) -> None:
        super().__init__(
            f"sgl_kernel.{op} is not provided by opspatch's CPU kernel layer (the sandbox's "
            "stand-in for sgl-kernel, which has no CPU build on PyPI)"
        )
        self.op = op
