"""The sandbox: a local fleet of stand-in SGLang engines on one machine.

`engine_src/sglang/` is the stand-in engine (package data, copied into each sandbox host; it is
never importable from the controller), and `install.py` installs it into a host's own virtual
environment like a real distribution.
"""
