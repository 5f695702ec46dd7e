"""The plays: each module makes the steps of one part of the tutorial (or of
one task: logs, chaos, the local cluster), pure functions of the environment
that return steps. A play never imports another play.

May import ``playbooks.core``, ``playbooks.config``, ``playbooks.access``,
``playbooks.cloud``, ``playbooks.job``, ``playbooks.runs`` and
``playbooks.twin``.
"""
