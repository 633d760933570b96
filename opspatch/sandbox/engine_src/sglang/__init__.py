"""A stand-in for SGLang, written for opspatch's sandbox (no SGLang code is copied)."""

from sglang.version import __version__

__all__ = ["__version__"]
