"""opspatch's SGLang plugin: the delivery path of live fixes into every process of a running
engine. Installed into the engine's environment as its own distribution, `opspatch_live`
(`opspatch.hosts.livedist` builds it), and loaded by SGLang's plugin framework in every process."""

from __future__ import annotations
