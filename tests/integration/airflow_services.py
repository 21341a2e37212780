"""Airflow services as subprocesses, PostgreSQL databases and roles and a Redis key prefix per test session, for
the real-scheduler tests ``tests/integration/test_scheduler.py`` and ``test_celery.py`` (import as
``from airflow_services import ...``).

The PostgreSQL server is the one ``tests/ledger_backends.py`` uses (``DP_LEDGER_TEST_PG_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``); it must accept a superuser, since the tests create databases
and login roles. The Redis server (the Celery broker) is ``DP_IT_REDIS_URL``, default ``redis://127.0.0.1:6379/0``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TypeVar

import psycopg
import pytest
import redis
import sqlalchemy as sa

from ledger_backends import PG_URL

BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("DP_IT_REDIS_URL", "redis://127.0.0.1:6379/0")
T = TypeVar("T")


def unreachable(reason: str) -> NoReturn:
    """Skip the test for a server it needs that is not running; fail instead when ``CI`` is set, since CI starts
    every server the integration tests need (``.ci/run``)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the integration test must run)")
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], T], *, timeout: float, what: str, every: float = 0.5,
             retry_on: tuple[type[Exception], ...] = ()) -> T:
    """Call ``condition`` until it returns a truthy value (returned); ``TimeoutError`` naming ``what`` after
    ``timeout`` seconds. Exceptions of the ``retry_on`` types count as not yet (e.g. a server not listening yet);
    any other propagates at once."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except retry_on as error:
            last, value = error, None
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}") from last


def wait_while_progressing(condition: Callable[[], T], progress: Callable[[], object], *, idle: float, what: str,
                           every: float = 0.25) -> T:
    """Call ``condition`` until it returns a truthy value (returned), as long as the work moves: ``TimeoutError``
    naming ``what`` once ``progress()`` (any comparable snapshot of the work's state, read after each call) has not
    changed for ``idle`` seconds. A loaded machine makes the work slower, not stuck, so only a hang trips it."""
    last, since = progress(), time.monotonic()
    while True:
        value = condition()
        if value:
            return value
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > idle:
            raise TimeoutError(f"{what}: nothing changed for {idle:.0f} s (last state: {last!r})")
        time.sleep(every)


@dataclass
class PostgresScratch:
    """Databases and roles made for one test session on the server of ``PG_URL``, all named ``dp_it_<hex>_*``
    and dropped by :meth:`drop`."""

    admin: psycopg.Connection
    prefix: str = field(default_factory=lambda: f"dp_it_{uuid.uuid4().hex[:10]}")
    databases: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)

    @classmethod
    @contextmanager
    def session(cls) -> Iterator[PostgresScratch]:
        """Connect as the server's superuser; skip (or fail under ``CI``) when the server cannot be reached."""
        url = sa.make_url(PG_URL).set(drivername="postgresql")
        try:
            admin = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True, connect_timeout=3)
        except psycopg.OperationalError as error:
            unreachable(f"PostgreSQL not reachable at {url.render_as_string()}: {str(error).strip()[:200]}")
        scratch = cls(admin)
        try:
            yield scratch
        finally:
            scratch.drop()
            admin.close()

    def url(self, database: str, role: str | None = None, driver: str = "psycopg") -> str:
        """SQLAlchemy URL of ``database`` on the server, as ``role`` (default: the admin's user)."""
        base = sa.make_url(PG_URL)
        return base.set(drivername=f"postgresql+{driver}", database=database,
                        username=role or base.username).render_as_string(hide_password=False)

    def dsn(self, database: str) -> str:
        """libpq connection string of ``database`` (for psycopg), as the admin."""
        return self.url(database).replace("postgresql+psycopg://", "postgresql://", 1)

    def create_database(self, suffix: str) -> str:
        name = f"{self.prefix}_{suffix}"
        self.admin.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return name

    def create_role(self, suffix: str, *, login: bool, member_of: str | None = None) -> str:
        name = f"{self.prefix}_{suffix}"
        membership = f' IN ROLE "{member_of}"' if member_of else ""
        self.admin.execute(f'CREATE ROLE "{name}" {"LOGIN" if login else "NOLOGIN"}{membership}')
        self.roles.append(name)
        return name

    def drop(self) -> None:
        for name in reversed(self.databases):
            self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for name in reversed(self.roles):  # their grants were on objects of the dropped databases only
            self.admin.execute(f'DROP ROLE IF EXISTS "{name}"')


@dataclass
class RedisScratch:
    """A key prefix of its own on the Redis server of :data:`REDIS_URL` for one test session, all keys under it
    deleted by :meth:`drop`. Given to Celery as kombu's ``global_keyprefix``, it keeps the broker's queues, unacked
    messages and the workers' broadcasts apart from any other session's on the same server and database."""

    client: redis.Redis
    prefix: str = field(default_factory=lambda: f"dp_it_{uuid.uuid4().hex[:10]}:")

    @classmethod
    @contextmanager
    def session(cls) -> Iterator[RedisScratch]:
        """Connect; skip (or fail under ``CI``) when the server cannot be reached."""
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=10)
        try:
            client.ping()
        except redis.RedisError as error:
            client.close()
            unreachable(f"Redis not reachable at {REDIS_URL}: {str(error).strip()[:200]}")
        scratch = cls(client)
        try:
            yield scratch
        finally:
            scratch.drop()
            client.close()

    @property
    def url(self) -> str:
        return REDIS_URL

    def keys(self) -> list[str]:
        return sorted(key.decode() for key in self.client.scan_iter(match=f"{self.prefix}*"))

    def drop(self) -> None:
        for key in self.keys():
            self.client.delete(key)


@dataclass
class AirflowServices:
    """Airflow CLI services started in their own process groups, their output in ``<log_dir>/<name>.log``."""

    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    #: name -> the command and the environment it was started with (what :meth:`restart` runs again)
    commands: dict[str, tuple[tuple[str, ...], dict[str, str]]] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """Run a CLI command of the venv (``airflow ...``, ``dpctl ...``) to completion; with ``check``, raise with
        its output on a non-zero exit."""
        done = subprocess.run([str(BIN / args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        return done

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a CLI command of the venv in the background, in a new process group (so that :meth:`stop_all`
        also ends the workers and task processes it forks); ``env`` adds to or overrides :attr:`env` for it."""
        env = env or {}
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process; a restart appends
        process = subprocess.Popen([str(BIN / args[0]), *args[1:]], env={**self.env, **env}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()  # the child holds its own descriptor
        self.processes[name] = process
        self.commands[name] = (args, env)
        return process

    def kill(self, name: str) -> None:
        """SIGKILL a service's whole process group (the service, and every process it forked that did not leave
        the group), as a lost machine or the OOM killer of a container would, and wait for the service to end."""
        process = self.processes[name]
        _signal_group(process, signal.SIGKILL)
        process.wait()

    def restart(self, name: str) -> subprocess.Popen:
        """Start a service again with the command and environment it was first started with."""
        args, env = self.commands[name]
        return self.start(name, *args, env=env)

    def group_of(self, pid: int) -> str | None:
        """The name of the service whose process group ``pid`` is in (None if none)."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return next((name for name, process in self.processes.items() if process.pid == group), None)

    def check_alive(self) -> None:
        """Raise if a service has exited (its log tail in the message)."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {process.returncode}:\n{self.tail(name)}")

    def stop_all(self, grace: float = 15) -> None:
        """SIGTERM every service's process group, then SIGKILL what is left after ``grace`` seconds."""
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process, signal.SIGKILL)  # forked workers may outlive their leader
            process.wait()

    def tail(self, name: str, lines: int = 60) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def lines(self, name: str, pattern: str) -> list[str]:
        """The lines of a service's log matching the regular expression ``pattern``."""
        return [line for line in self.tail(name, 10**9).splitlines() if re.search(pattern, line)]

    def tails(self, lines: int = 60) -> str:
        return "\n".join(f"----- airflow {name} (last {lines} lines) -----\n{self.tail(name, lines)}"
                         for name in self.processes)


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def task_log_text(path: Path) -> str:
    """A task log as text, one line per record: ``<timestamp> <level> <event>``, then ``<exc_type>: <exc_value>``
    for each exception in it (Airflow 3 writes JSON lines; other lines are kept as they are)."""
    lines: list[str] = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            lines.append(raw)
            continue
        lines.append(f"{record.get('timestamp', '')} {record.get('level', '')} {record.get('event', '')}")
        lines.extend(f"  {error.get('exc_type')}: {error.get('exc_value')}"
                     for error in record.get("error_detail") or [] if isinstance(error, dict))
    return "\n".join(lines)
