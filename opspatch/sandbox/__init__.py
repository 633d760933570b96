"""The sandbox: a local fleet of SGLang engines on one machine, the stand-in or real SGLang on
the CPU (`real/`: its cached environment, CPU kernel layer, models and launch)."""

MAX_HOSTS = 32
"""Most hosts one sandbox holds (loopback addresses 127.0.0.2 and up, one engine each)."""
