# The two commands of the README's quick start, and a few more.
.PHONY: venv train test goldens lock clean-local

venv:
	@scripts/bootstrap

## Train the tutorial's llama3-8b job, scaled down, on a local Ray cluster (no cloud account).
train: venv
	.venv/bin/invoke train --fresh

## Run every test (lint, type check, unit, golden transcripts, real clients on loopback fakes, sshd on loopback, local Ray + MaxText runs).
test: venv
	@scripts/test-deps
	.venv/bin/ruff check playbooks tasks.py tests bench
	.venv/bin/mypy
	.venv/bin/python -m pytest

## Regenerate the golden dry-run transcripts after an intended change of commands.
goldens: venv
	.venv/bin/python -m tests.goldens

## Re-resolve requirements.in into requirements.lock and trainer/requirements.txt.
lock:
	scripts/lock

## Stop the local Ray cluster this project started (by pid).
clean-local: venv
	.venv/bin/invoke teardown --yes
