"""Transports: how a command reaches a host. One small interface (`base.Transport`, a context
manager), three implementations: `ssh.SSHTransport`, `local.LocalTransport`, and
`scripted.ScriptedTransport` (a handler function answers host-agent requests, for fast tests of
the pipeline's rare paths)."""

from opspatch.hosts.transport.base import Command, CommandResult, Transport

__all__ = ["Command", "CommandResult", "Transport"]
