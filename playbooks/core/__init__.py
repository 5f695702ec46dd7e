"""The engine: it knows nothing of GKE, Ray or this project. Three layers,
each with one name:

- a ``Playbook`` (``play.py``) runs steps: in order or along their ``after``
  edges, each step's probe -> decide -> act -> verify, its outcome, the
  recap (``recap.py``). What a step is: ``step.py``.
- a ``Runner`` (``runner.py``) answers facts and runs actions as the mode
  allows (apply, check, dry run; declared facts in tests, ``fixtures.py``),
  with retries, each command and in-process fact written to the run's log
  (``runlog.py``).
- a ``Connector`` (``connector/``) is where they happen: this machine, or a
  controller host over SSH. Nothing else in the project starts a process,
  touches a file of a run, reads over HTTP or kills.

What they share: ``command`` (argv lists, pipes, a shell-pasteable line),
``facts`` (a fact, ABSENT, an action), ``errors`` (each a one-line message),
``inventory`` (environments checked against a schema), ``yamlfile`` (a
user's YAML read strictly), ``render`` (``${VAR}`` templates through
envsubst, never silently empty), ``http`` (read-only HTTP looks), ``procs``
and ``pidfile`` (this machine's processes, the ones we started), ``lock``
(one holder at a time, named).

A ``Session`` (``playbooks/cli/session.py``, the project's, not the engine's) is
one task run: the inventory's environment, the mode, and these three.
"""
