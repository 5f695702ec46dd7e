"""The chaos play's steps on both targets, from declared facts (nothing
starts): a host made sick (the twin's ``ray start`` with fewer JAX devices
than its chips), healed, not sickened twice; a hang that never ends said as
such on both targets; GKE refusing to make a host sick."""
from __future__ import annotations

from playbooks.core.fixtures import Answers
from playbooks.core.runner import Mode
from playbooks.plays import chaos
from playbooks.twin.chaos_twin import TwinHosts, devices_of
from playbooks.twin.nodes import host_command, hosts_of
from tests.conftest import env, run_with_facts
from tests.goldens import dry_run

LOCAL = env("local")
DEV = env("dev")
HEALTHY = {"process": True, "joined": True, "devices": LOCAL.devices_per_host}
SICK = {"process": True, "joined": True, "devices": LOCAL.devices_per_host - 1}
DOWN = {"process": False, "joined": False, "devices": None}


def applied(lines):
    return [ln.split("apply  ", 1)[1] for ln in lines if ln.startswith("  apply")]


def health_keys(e=LOCAL):
    w = TwinHosts(e)
    return {h.name: w.health_fact(h).key for h in w.hosts}, w.nodes().key


def test_the_sick_start_is_the_hosts_own_ray_start_with_one_device_fewer():
    host = hosts_of(LOCAL)[0]
    whole, sick = host_command(LOCAL, host), host_command(LOCAL, host, devices=LOCAL.devices_per_host - 1)
    assert sick.argv == whole.argv
    changed = {k: (v, dict(sick.env)[k]) for k, v in whole.env if dict(sick.env)[k] != v}
    assert changed == {"XLA_FLAGS": ("--xla_force_host_platform_device_count=4",
                                     "--xla_force_host_platform_device_count=3")}


def test_the_dry_run_kills_the_first_host_and_starts_it_again_sick():
    rc, out, err = dry_run("local", ["chaos.sicken-worker"])
    assert rc == 0 and "PROCESSES STARTED" not in err, err
    host = hosts_of(LOCAL)[0]
    lines = applied(out.splitlines())
    assert lines[0].startswith(f"kill -KILL $(cat .state/local/nodes/{host.name}.pid)")
    assert lines[1].startswith("# worker_lost: ")
    assert lines[2] == host_command(LOCAL, host, devices=3).line()
    assert ("XLA_FLAGS=--xla_force_host_platform_device_count=3 nohup python -m playbooks.twin.host_process ray start "
            "--address=127.0.0.2:6390") in lines[2]
    assert lines[3].startswith("# host_sickened: ")
    assert f"would start TPU host {host.name} again with 3 of its 4 JAX devices" in out


def test_a_sick_host_is_left_sick_and_a_host_that_is_down_comes_back_sick_without_a_kill():
    health, nodes = health_keys()
    first, second = hosts_of(LOCAL)[0].name, hosts_of(LOCAL)[1].name
    recap, out = run_with_facts(chaos.sicken_steps(LOCAL), {health[first]: SICK})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    assert applied(out) == []
    assert f"TPU host {first} already runs sick: 3 of its 4 JAX devices" in out.text()

    verify = TwinHosts(LOCAL).health_verify([], 3).fact.key
    recap, out = run_with_facts(chaos.sicken_steps(LOCAL, second), {health[second]: DOWN, nodes: [],
                                                                     verify: {second: SICK}})
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    lines = applied(out)
    assert not any(ln.startswith("kill") for ln in lines), lines
    assert lines[0] == host_command(LOCAL, hosts_of(LOCAL)[1], devices=3).line()


def test_a_sickened_host_that_starts_whole_fails_its_verify():
    health, nodes = health_keys()
    first = hosts_of(LOCAL)[0].name
    verify = TwinHosts(LOCAL).health_verify([hosts_of(LOCAL)[0]], 3).fact.key
    recap, out = run_with_facts(chaos.sicken_steps(LOCAL), {health[first]: HEALTHY, nodes: [],
                                                             verify: {first: HEALTHY}})
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0", out.text()
    assert f"TPU host {first} gives JAX 4 devices, not 3" in out.text()


def test_heal_starts_only_the_sick_hosts_again_whole_and_then_has_nothing_to_do():
    health, nodes = health_keys()
    first, second = (h.name for h in hosts_of(LOCAL))
    recap, out = run_with_facts(chaos.heal_steps(LOCAL), {health[first]: HEALTHY, health[second]: SICK, nodes: []},
                                mode=Mode.CHECK)
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    lines = applied(out)
    assert lines[0].startswith(f"kill -KILL $(cat .state/local/nodes/{second}.pid)")
    assert lines[1] == host_command(LOCAL, hosts_of(LOCAL)[1]).line()
    assert not any(first in ln for ln in lines), lines

    recap, out = run_with_facts(chaos.heal_steps(LOCAL), {health[first]: HEALTHY, health[second]: HEALTHY})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0" and applied(out) == []
    assert "no TPU host is sick: nothing to heal" in out.text()


def test_a_hosts_devices_are_read_from_its_environment_and_unknown_when_not_said():
    env_of = b"PATH=/bin\0XLA_FLAGS=--xla_cpu_foo=1 --xla_force_host_platform_device_count=3\0TPU_NAME=x\0"
    assert devices_of(env_of) == 3
    assert devices_of(b"PATH=/bin\0XLA_FLAGS=--xla_cpu_foo=1\0") is None
    assert devices_of(b"PATH=/bin\0") is None


def test_a_hang_that_never_ends_says_so_on_both_targets_and_resumes_nothing():
    rc, out, err = dry_run("local", ["chaos.hang-worker", "--restore-after=0"])
    assert rc == 0, err
    assert "resume the training worker" not in out and "kill -CONT" not in out
    assert "would freeze the training worker of TPU host tpu-group-0-0 (left frozen)" in out

    workers = TwinHosts(LOCAL).freezer().workers.key
    recap, out = run_with_facts(chaos.hang_steps(LOCAL, 0), {
        workers: Answers({"tpu-group-0-0": [{"pid": 7, "stopped": False}]},
                         {"tpu-group-0-0": [{"pid": 7, "stopped": True}]})})
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    assert applied(out)[0] == "kill -STOP 7" and not any("CONT" in ln for ln in applied(out))
    assert "would freeze the training worker of TPU host tpu-group-0-0 (left frozen)" in out.text()
    done, _, _ = TwinHosts(LOCAL).hang_words(("tpu-group-0-0", ["7"]), 0)
    assert done.endswith("its Ray node stays up (left frozen: `kill -CONT 7` resumes it)")
    assert "left" not in TwinHosts(LOCAL).hang_words(("tpu-group-0-0", ["7"]), 60)[0]

    rc, out, err = dry_run("dev", ["chaos.hang-worker", "--restore-after=0"])
    assert rc == 0, err
    assert "sleep" not in out and "-CONT" not in out.split("left stopped")[0]
    assert "(left stopped: `kubectl exec" in out


def test_gke_refuses_to_make_a_host_sick_in_one_line():
    assert chaos.sicken_problem(LOCAL) is None
    assert "no way to make a real TPU host sick" in (chaos.sicken_problem(DEV) or "")
    for task in ("chaos.sicken-worker", "chaos.heal-worker"):
        rc, out, err = dry_run("dev", [task])
        assert rc == 2 and out == "", (task, out)
        assert err.strip().count("\n") == 0 and "no way to make a real TPU host sick" in err, err


def test_a_hosts_devices_are_read_from_its_running_process_and_an_unsaid_count_is_could_not_look(tmp_path,
                                                                                                  monkeypatch):
    """health() on real processes (a `sleep`, not a Ray node): its devices
    from /proc/<pid>/environ; gone: not running; no XLA_FLAGS: a probe
    that could not tell, never a healthy or a sick host."""
    import os
    import subprocess
    import time
    from pathlib import Path

    import pytest

    from playbooks.core.connector.local import LocalConnector
    from playbooks.core.errors import ProbeFailed
    from playbooks.core.pidfile import PidFile
    from playbooks.twin import chaos_twin

    here = LocalConnector(tmp_path)
    monkeypatch.setattr(chaos_twin.connectors, "this_machine", lambda: here)
    monkeypatch.setattr(chaos_twin, "pidfile", lambda env, name: PidFile(tmp_path, name, "", via=here))
    monkeypatch.setattr(chaos_twin, "list_nodes", lambda url, via: [])
    host = hosts_of(LOCAL)[0]
    base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    for flags, want in (("--xla_force_host_platform_device_count=3", 3), (None, ProbeFailed)):
        p = subprocess.Popen(["sleep", "60"], env={**base, **({"XLA_FLAGS": flags} if flags else {})})
        try:
            # Until its exec, a child's /proc/<pid>/environ is still this
            # process's (read that early once in `make test`, under load).
            deadline = time.monotonic() + 10
            while not Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"sleep") and time.monotonic() < deadline:
                time.sleep(0.01)
            PidFile(tmp_path, host.name, "", via=here).write(p.pid)
            if want is ProbeFailed:
                with pytest.raises(ProbeFailed, match="could not tell TPU host tpu-group-0-0's devices"):
                    chaos_twin.health(LOCAL, host)
            else:
                assert chaos_twin.health(LOCAL, host) == {"process": True, "joined": False, "devices": want}
        finally:
            p.kill()
            p.wait()
    assert chaos_twin.health(LOCAL, host) == {"process": False, "joined": False, "devices": None}
