"""A real OpenSSH server on 127.0.0.1 for the controller-host tests: its own
host key, a user key, a known_hosts file that trusts it, and the login
environment its sessions get (sshd's SetEnv: the controller's own gcloud
and kubectl configuration, as a real controller host has)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "playbook-tests", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)


@dataclass
class Sshd:
    base: Path
    port: int
    proc: subprocess.Popen

    @property
    def target(self) -> str:
        return f"root@127.0.0.1:{self.port}"

    @property
    def identity_file(self) -> str:
        return str(self.base / "user_key")

    @property
    def known_hosts(self) -> str:
        return str(self.base / "known_hosts")

    def inventory_keys(self, remote_dir: str) -> dict[str, str]:
        return {"controller": self.target, "identity_file": self.identity_file,
                "known_hosts": self.known_hosts, "remote_dir": remote_dir}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _setenv(env: Mapping[str, str]) -> str:
    for k, v in env.items():
        assert " " not in v and '"' not in v, f"{k}: sshd's SetEnv takes no spaces here"
    return " ".join(f"{k}={v}" for k, v in env.items())


def start(base: Path, env: Mapping[str, str], user_key: Path | None = None, log_level: str = "INFO",
          sftp: bool = True) -> Sshd:
    """sshd -D on a free loopback port; returns when it accepts. ``user_key``:
    accept this key (another server's) instead of a new one. ``sftp=False``:
    no ``Subsystem sftp`` line (a hardened bastion's sshd), so a session asking
    for SFTP is refused."""
    if not os.path.exists(SSHD):
        raise RuntimeError(f"{SSHD} is missing: scripts/test-deps installs openssh-server")
    base.mkdir(parents=True, exist_ok=True)
    if user_key is not None:
        for suffix in ("", ".pub"):
            shutil.copy(f"{user_key}{suffix}", base / f"user_key{suffix}")
    for name in ("host_key", "user_key"):
        if not (base / name).exists():
            keygen(base / name)
    shutil.copy(base / "user_key.pub", base / "authorized_keys")
    port = free_port()
    host_pub = (base / "host_key.pub").read_text().split()[:2]
    (base / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_pub)}\n")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
    (base / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {base}/host_key
PidFile {base}/sshd.pid
AuthorizedKeysFile {base}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxSessions 64
MaxStartups 64
{"Subsystem sftp internal-sftp" if sftp else "# no Subsystem sftp: SFTP is refused"}
LogLevel {log_level}
SetEnv {_setenv(env)}
""")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(base / "sshd_config")],
                            stdout=open(base / "sshd.log", "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # noqa: SIM115 - the server keeps it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(base / 'sshd.log').read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return Sshd(base, port, proc)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sshd did not start listening in 10s")


def running(base: Path, env: Mapping[str, str], sftp: bool = True) -> Iterator[Sshd]:
    s = start(base, env, sftp=sftp)
    try:
        yield s
    finally:
        s.stop()
