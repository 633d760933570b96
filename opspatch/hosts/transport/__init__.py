"""Transports: how a command reaches a host. One small interface, two implementations."""

from opspatch.hosts.transport.base import Command, CommandResult, Transport

__all__ = ["Command", "CommandResult", "Transport"]
