"""gcloud's credentials and configuration, read once per run: one
`gcloud config config-helper --format=json` process gives the access token
gcloud would send, its expiry, and every property gcloud resolved (its
configuration files and its CLOUDSDK_* variables: the account, the API
endpoint overrides, the CA file, a proxy). The in-process Google reads
(``gcp_api``) and the kubernetes client (``kube_api``, in place of
GKE's exec credential plugin, which runs that same command and hands its
token on) share it.

The answer is asked again when the token is within five minutes of its
expiry, after ten minutes when gcloud gives no expiry (a token file, which
may be replaced), and when gcloud's configuration sentinel file changed (a
`gcloud config set` or `gcloud auth login` touches it: that is how the auth
plugin's own cache knows). A helper that fails (no account, no gcloud) is
``None``: every command then runs as the process it is, and says why
itself; where the helper said there is no account, ``refusal`` keeps its
words (``gcp_api`` answers its reads with them).

Between runs, an answer whose token has an expiry is kept in a file of its
own (``TokenCache``: mode 0600 under .state/gcloud-tokens/, named by a hash
of gcloud's configuration folder and every variable gcloud reads), as
gke-gcloud-auth-plugin keeps its token next to the kubeconfig: the next
run uses it while it is more than five minutes from its expiry and the
sentinel file is unchanged, and starts no config-helper. A token without an
expiry (an access-token file) is never kept.

A token an API answered 401 (revoked, its account's key disabled, a clock
that misread its expiry) is dropped, here and in the kept file, and renewed
once (``renew``: `gcloud config config-helper --force-auth-refresh`, as
gcloud's own cached token would be served again without it), not used for
the rest of its hour. The read is then made once more with the new token; a
second 401 is the API's answer, left to the command's process to say.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playbooks.access.cli_clients import NO_ACCOUNT_WORDS

HELPER = ("config", "config-helper", "--format=json")
# gcloud 528's config-helper flag that refreshes the token even when its own
# cache holds one not yet expired (`gcloud config config-helper --help`).
FORCE_REFRESH = "--force-auth-refresh"
EXPIRY_MARGIN = 300.0   # ask again this many seconds before the token expires
NO_EXPIRY_TTL = 600.0   # how long a token without an expiry is used
HELPER_TIMEOUT = 60.0
# Variables a command sets for how gcloud reports (its log's verbosity, a
# strict compute list): not the credentials or the endpoints. The helper
# runs without them, so one answer serves every command of the run, and its
# properties are those a plain `gcloud config list` shows.
NOT_CREDENTIALS = ("CLOUDSDK_CORE_VERBOSITY", "CLOUDSDK_COMPUTE_ALLOW_PARTIAL_ERROR")


@dataclass
class Credentials:
    """One config-helper answer: the token, when to ask again, gcloud's
    resolved properties ({section: {name: value}}), the sentinel file."""

    token: str
    renew_at: float
    properties: dict[str, dict[str, Any]]
    sentinel: str = ""
    sentinel_mtime: float | None = None
    expiry: str | None = None

    def prop(self, section: str, name: str) -> Any:
        return (self.properties.get(section) or {}).get(name)

    def fresh(self) -> bool:
        return time.monotonic() < self.renew_at and _mtime(self.sentinel) == self.sentinel_mtime


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime if path else None
    except OSError:
        return None


def _renew_at(expiry: str | None, now: float) -> float:
    """When to ask again: five minutes before ``expiry`` (gcloud's ISO-8601
    time), or ten minutes from now when there is none."""
    if not expiry:
        return now + NO_EXPIRY_TTL
    try:
        at = datetime.datetime.fromisoformat(expiry.replace("Z", "+00:00"))
    except ValueError:
        return now  # a time we cannot read: ask each time
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    left = (at - datetime.datetime.now(datetime.UTC)).total_seconds()
    return now + max(0.0, min(left - EXPIRY_MARGIN, NO_EXPIRY_TTL * 6))


def parse_helper(stdout: str, now: float) -> Credentials | None:
    """config-helper's JSON as ``Credentials``; None when it has no token."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    cred = doc.get("credential") or {}
    token = cred.get("access_token") if isinstance(cred, dict) else None
    if not isinstance(token, str) or not token:
        return None
    props = ((doc.get("configuration") or {}).get("properties")) or {}
    sentinel = str(((doc.get("sentinels") or {}).get("config_sentinel")) or "")
    expiry = cred.get("token_expiry")
    return Credentials(token, _renew_at(expiry if isinstance(expiry, str) else None, now),
                       props if isinstance(props, dict) else {}, sentinel, _mtime(sentinel),
                       expiry if isinstance(expiry, str) else None)


# What decides which credentials and properties gcloud resolves: its
# configuration folder (CLOUDSDK_CONFIG, else under HOME), its CLOUDSDK_*
# properties, Google's credential variables, a proxy and the gcloud found.
KEY_PREFIXES = ("CLOUDSDK_", "GOOGLE_", "GCE_")
KEY_NAMES = ("HOME", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


def cache_key(env: Mapping[str, str]) -> str:
    """The name of an environment's kept answer: a hash of what gcloud
    reads (``KEY_PREFIXES``, ``KEY_NAMES``) and of the gcloud it runs."""
    kept = sorted((k, v) for k, v in env.items()
                  if (k.startswith(KEY_PREFIXES) or k in KEY_NAMES) and k not in NOT_CREDENTIALS)
    gcloud = shutil.which("gcloud", path=env.get("PATH", "")) or ""
    return hashlib.sha256(json.dumps([gcloud, kept]).encode()).hexdigest()[:32]


@dataclass
class TokenCache:
    """config-helper answers with an expiry, kept between runs: one file
    per ``cache_key``, readable by its owner only."""

    folder: Path

    def load(self, env: Mapping[str, str], now: float) -> Credentials | None:
        try:
            doc = json.loads((self.folder / f"{cache_key(env)}.json").read_text())
            expiry, sentinel = doc["expiry"], doc["sentinel"]
            got = Credentials(doc["token"], _renew_at(expiry, now), doc["properties"], sentinel,
                              doc["sentinel_mtime"], expiry)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        ok = (isinstance(got.token, str) and got.token and isinstance(expiry, str) and isinstance(sentinel, str)
              and isinstance(got.properties, dict))
        return got if ok and got.fresh() else None

    def store(self, env: Mapping[str, str], got: Credentials) -> None:
        if not got.expiry:
            return
        doc = {"token": got.token, "expiry": got.expiry, "properties": got.properties, "sentinel": got.sentinel,
               "sentinel_mtime": got.sentinel_mtime}
        path = self.folder / f"{cache_key(env)}.json"
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(part, path)
        except OSError:
            with contextlib.suppress(OSError):
                part.unlink()

    def forget(self, env: Mapping[str, str]) -> None:
        """Drop the kept answer of this environment (its token was refused)."""
        with contextlib.suppress(OSError):
            (self.folder / f"{cache_key(env)}.json").unlink()


def _key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A child environment as the helper sees it (without NOT_CREDENTIALS):
    one answer, or one refusal, per key."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in NOT_CREDENTIALS))


@dataclass
class GcloudCredentials:
    """The run's gcloud credentials, one per child environment; with a
    ``cache``, an answer kept by an earlier run is used first."""

    cache: TokenCache | None = None
    _held: dict[tuple, Credentials | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    helper_runs: int = 0  # how many config-helper processes this run started
    renewals: int = 0  # how many tokens an API refused (401) were renewed this run
    # Per child environment: the helper's own words when it found no account
    # (``refusal``).
    _refused: dict[tuple, str] = field(default_factory=dict)

    def refusal(self, env: Mapping[str, str]) -> str | None:
        """What the helper said, for this environment, when it failed for
        want of an account (gcloud's NO_ACCOUNT_WORDS: a proven refusal, which
        every gcloud command that needs credentials makes in the same words,
        its own name first, before any API call); None otherwise, and before
        the helper was asked."""
        with self._lock:
            return self._refused.get(_key(env))

    def get(self, env: Mapping[str, str]) -> Credentials | None:
        key = _key(env)
        env = dict(key)
        with self._lock:
            held = self._held.get(key)
            if held is not None and held.fresh():
                return held
            if key in self._held and held is None:
                return None  # the helper failed once this run: processes from now on
            got = self.cache.load(env, time.monotonic()) if self.cache is not None else None
            if got is None:
                got = self._ask(env, key)
                if got is not None and self.cache is not None:
                    self.cache.store(env, got)
            self._held[key] = got
            return got

    def renew(self, env: Mapping[str, str], refused: str) -> Credentials | None:
        """After an API answered ``refused`` (a token) with 401: that token
        dropped (held and kept) and a new one asked for, with gcloud's own
        cache refreshed. Another thread that renewed it already: its answer.
        None where no new token could be had (the same one again included):
        the command then runs as its process, which says why."""
        key = _key(env)
        env = dict(key)
        with self._lock:
            held = self._held.get(key)
            if held is not None and held.token != refused and held.fresh():
                return held
            if self.cache is not None:
                self.cache.forget(env)
            got = self._ask(env, key, force=True)
            if got is not None and got.token == refused:
                got = None
            if got is not None and self.cache is not None:
                self.cache.store(env, got)
            self._held[key] = got
            self.renewals += 1
            return got

    def _ask(self, env: Mapping[str, str], key: tuple, force: bool = False) -> Credentials | None:
        gcloud = shutil.which("gcloud", path=env.get("PATH", ""))
        if gcloud is None:
            return None
        self.helper_runs += 1
        try:
            p = subprocess.run([gcloud, *HELPER, *((FORCE_REFRESH,) if force else ())], env=dict(env),
                               stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=HELPER_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if p.returncode != 0 and NO_ACCOUNT_WORDS in p.stderr:
            self._refused[key] = p.stderr
        return parse_helper(p.stdout, time.monotonic()) if p.returncode == 0 else None
