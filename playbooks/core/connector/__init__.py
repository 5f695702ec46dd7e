"""Connectors: where effects happen (``base.Connector``, the interface).

- ``local.LocalConnector``: this machine, through ``subprocess`` and the
  local filesystem.
- ``ssh.SshConnector``: a controller host over one SSH connection: commands
  on exec channels (``channel``), files through SFTP, or through ``cat`` when
  the controller offers no SFTP.
- ``lines``: the line splitters of a remote command's output.

Its errors are the engine's (``errors.Unreachable``, ``errors.CommandFailed``);
pid files, which use a connector, are ``core.pidfile``.
"""
from __future__ import annotations

from .base import NOT_FOUND, TIMED_OUT, Connector, Ran
from .local import LocalConnector
from .ssh import SshConnector, parse_target

__all__ = ["NOT_FOUND", "TIMED_OUT", "Connector", "LocalConnector", "Ran", "SshConnector", "parse_target"]
