"""What each Invoke task runs: one task run (``session``: the inventory's
environment, the mode, the runner and its connector, clean errors), which
steps a task runs (``task_steps``), a chain of tasks on one command line
(``chain``), the question before a task deletes data (``confirm``), and
the read-only composers ``status`` and ``doctor``.

The top layer: may import every other package, plays included.
"""
