# The two commands of the README's quick start, and a few more.
.PHONY: venv train test test-processes check goldens lock clean-local

# The project's modules compiled once: every `invoke` the tests start imports
# them, and where PYTHONDONTWRITEBYTECODE is set (CI's environment) each would
# compile them again (~0.15 s of CPU a process). compileall writes anyway.
BYTECODE = .venv/bin/python -m compileall -q playbooks tasks.py > /dev/null

# The local targets (train, clean-local) act on the shipped inventory's local
# environment, whatever the user selected (INVOKE_PLAYBOOK_ENV,
# INVOKE_PLAYBOOK_INVENTORY, a runtime config file, a GKE `default:`): they
# never touch a GKE environment. INVOKE_PLAYBOOK_KIND=local refuses the run
# in one line if that environment is not kind local.
LOCAL_INVOKE = env -u INVOKE_RUNTIME_CONFIG INVOKE_PLAYBOOK_INVENTORY="$(CURDIR)/inventory.yaml" \
	INVOKE_PLAYBOOK_ENV=local INVOKE_PLAYBOOK_KIND=local .venv/bin/invoke

venv:
	@scripts/bootstrap

## Train the tutorial's llama3-8b job, scaled down, on the local Ray cluster (no cloud account), from step 0.
train: venv
	$(LOCAL_INVOKE) train --fresh

## Run every test (lint, type check, unit, golden transcripts, real clients on loopback fakes, sshd on loopback, local Ray + MaxText runs);
## the real-client tests whose plays write (marked both_ways) run twice: the second time every gcloud and kubectl command is its process.
test: venv
	@scripts/test-deps
	.venv/bin/ruff check playbooks trainer tasks.py tests bench
	.venv/bin/mypy
	@$(BYTECODE)
	.venv/bin/python -m pytest

## The real-client tests whose plays write (marked both_ways: cordon, taint, label, pod delete, which the kubernetes
## client answers in-process), alone, with every gcloud and kubectl command as its real process
## (`pytest --processes-only`: TPU_PLAYBOOKS_PROCESSES_ONLY=1). `make test` runs them both ways.
test-processes: venv
	@scripts/test-deps
	@$(BYTECODE)
	.venv/bin/python -m pytest --processes-only -m both_ways

## What a contributor runs before each commit (under 2 minutes): lint, types, unit tests, golden dry runs
## (not the real clients against the fakes, the AOT compiles, the local Ray runs or the health gate across JAX
## processes: `make test` runs those too). Three workers on two cores: a third of this selection's time is
## waits (sshd, timeouts), which a third worker fills (measured: 104 s against 125 s with two).
check: venv
	@scripts/test-deps
	.venv/bin/ruff check playbooks trainer tasks.py tests bench
	.venv/bin/mypy
	@$(BYTECODE)
	.venv/bin/python -m pytest -n 3 -m "not e2e and not clients and not compile and not multiprocess"

## Regenerate the golden dry-run transcripts after an intended change of commands.
goldens: venv
	.venv/bin/python -m tests.goldens

## Re-resolve requirements.in into requirements.lock and trainer/requirements.txt.
lock:
	scripts/lock

## Stop the local Ray cluster this project started (by pid), whatever environment is selected.
clean-local: venv
	$(LOCAL_INVOKE) teardown --yes
