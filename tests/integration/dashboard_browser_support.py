"""The budget dashboard's browser test (``tests/integration/test_dashboard_browser.py``): a ledger of real releases,
an Airflow api-server serving the dashboard plugin, and Debian's Chromium driven by Playwright (import as
``from dashboard_browser_support import ...``).

The browser is the system's Chromium (``/usr/bin/chromium``, Debian's ``chromium`` package, which ``.ci/run``
installs), never a browser Playwright downloads: CI machines may have no internet.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import httpx
import pytest

from dp_operators import gaussian_mechanism, laplace_mechanism, run_release, vector_release
from dp_operators.ledger import Ledger, LedgerConfig, ReleaseKey
from dp_operators.release import plan_release
from dp_operators.spec import load_spec

from airflow_services import AirflowServices, free_port, wait_for
from ledger_backends import account_config
from support import EXAMPLE_SPEC, REPO, SHARED_DATA, governor, spender

CHROMIUM = Path("/usr/bin/chromium")
#: Headless, and nothing the browser would fetch on its own (updates, safe-browsing lists): the test's only traffic
#: is to the api-server.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
VIEWPORT = {"width": 1200, "height": 800}
#: Full-page PNGs of each page, overwritten by every run (git-ignored; docs/images/ holds copies).
SCREENSHOTS = REPO / "screenshots"
PUMS_CSV = SHARED_DATA / "pums_california_demographics_1000.csv"

#: SimpleAuthManager users (``name:role``) and their passwords: an Airflow admin, and an Airflow viewer (the
#: least role that may see the UI, hence the dashboard).
USERS = {"admin": ("admin", "admin-password"), "auditor": ("viewer", "auditor-password")}

CENSUS_DAG, DEMOGRAPHICS_DAG, PUMS_DAG = "adult_census_release", "adult_weekly_counts", "pums_income_release"
#: Run ids as Airflow writes them (``+`` and ``:`` must survive the pages' links).
CENSUS_RUNS = [f"scheduled__2026-0{month}-01T00:00:00+00:00" for month in (1, 2, 3)]
#: The races of UCI Adult whose counts the demographics releases publish, in this order.
RACES = ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]
INCOME_BOUND = 200_000  # PUMS income clipped to [0, 200,000] dollars before summing


def browser_unavailable_reason() -> str | None:
    """Why the browser test cannot run here (no Playwright, no Debian Chromium), or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright (python) is not installed: pip install -e '.[test]'"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found: install Debian's chromium package (apt-get install -y chromium)"
    return None


def require_browser() -> None:
    """Skip the calling test when the browser cannot run, or fail under ``CI`` (the test must run there)."""
    reason = browser_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the dashboard's browser test must run)")
    pytest.skip(reason)


@dataclass(frozen=True)
class DashboardLedger:
    """The SQLite ledger the dashboard shows: three accounts and the charges of real releases.

    * ``census_adult`` (zCDP, rho cap 3/5 as in ``config/ledgers.yaml``, delta 1e-6): the example spec (``config/releases/adult_census.yaml``)
      released three times on UCI Adult, a fourth release abandoned after its reservation, a fifth reserved (in
      flight).
    * ``adult_demographics`` (pure DP, epsilon 2): people by race (a vector) and the total, by the Python API,
      twice; one reservation released (returned) before any noise was drawn.
    * ``pums_income`` (approx DP, epsilon 1, delta 1e-5): people and their total income (clipped) in the PUMS
      California extract, by the Python API.
    """

    path: Path
    census_releases: tuple[int, ...]  # charge ids of the committed census releases, in order

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def reader(self) -> Ledger:
        """A keyless view of the ledger (as the dashboard has): reads only."""
        return Ledger(self.url)


def build_ledger(path: Path, adult_aggregates: dict, adult_csv: Path) -> DashboardLedger:
    """Create the ledger of :class:`DashboardLedger` at ``path`` (a new SQLite file) by releasing real data."""
    url = f"sqlite:///{path}"
    officer = governor(url)
    officer.init_schema()
    officer.apply_config(LedgerConfig(version=1, accounts={
        "census_adult": account_config("zcdp", cap="3/5", delta="1e-6", dags=(CENSUS_DAG,)),
        "adult_demographics": account_config("pure_dp", epsilon="2", dags=(DEMOGRAPHICS_DAG,)),
        "pums_income": account_config("approx_dp", epsilon="1", delta="1e-5", dags=(PUMS_DAG,)),
    }))
    ledger = spender(url)

    spec = load_spec(EXAMPLE_SPEC)
    spec_hash = hashlib.sha256(EXAMPLE_SPEC.read_bytes()).hexdigest()
    census = []
    for run_id in CENSUS_RUNS:
        key = ReleaseKey(CENSUS_DAG, run_id, "release", -1, spec.release)
        run_release(spec, adult_aggregates, ledger, key, spec_hash=spec_hash)
        census.append(_charge_id(ledger, key))
    # the engine's own plan: what run_release would reserve for the same spec on this account
    plan = plan_release(spec, accountant="zcdp")
    mechanisms, charge = [step.describe() for step in plan.steps], plan.charge("zcdp")
    crashed = ReleaseKey(CENSUS_DAG, "scheduled__2026-04-01T00:00:00+00:00", "release", -1, spec.release)
    ledger.abandon(ledger.reserve(crashed, account="census_adult", amount=charge, mechanisms=mechanisms,
                                  spec_hash=spec_hash, try_number=1))
    in_flight = ReleaseKey(CENSUS_DAG, "manual__2026-04-02T09:30:00+00:00", "release", -1, spec.release)
    ledger.reserve(in_flight, account="census_adult", amount=charge, mechanisms=mechanisms, spec_hash=spec_hash,
                   try_number=1)

    by_race = _adult_people_by_race(adult_csv)
    for week in ("2026-W02", "2026-W03"):
        key = ReleaseKey(DEMOGRAPHICS_DAG, week, "people_by_race", -1, "adult_people_by_race")
        vector_release(by_race, sensitivity=1, epsilon=Fraction(1, 2), max_partitions_contributed=1,
                       mechanism="discrete_laplace", ledger=ledger, account="adult_demographics", key=key)
        laplace_mechanism(sum(by_race), sensitivity=1, epsilon=Fraction(1, 4), ledger=ledger,
                          account="adult_demographics",
                          key=ReleaseKey(DEMOGRAPHICS_DAG, week, "people", -1, "adult_people"))
    returned = ReleaseKey(DEMOGRAPHICS_DAG, "2026-W04", "people_by_race", -1, "adult_people_by_race")
    ledger.release(ledger.reserve(returned, account="adult_demographics", amount=Fraction(1, 2),
                                  mechanisms=[{"mechanism": "discrete_laplace", "scale": 2.0}],
                                  spec_hash="0" * 64, try_number=1))

    people, income = _pums_people_and_income(PUMS_CSV)
    laplace_mechanism(people, sensitivity=1, epsilon=Fraction(1, 5), ledger=ledger, account="pums_income",
                      key=ReleaseKey(PUMS_DAG, "2026-01-31", "people", -1, "pums_people"))
    gaussian_mechanism(income, sensitivity=INCOME_BOUND, epsilon=Fraction(1, 2), delta=Fraction(1, 10**6),
                       ledger=ledger, account="pums_income",
                       key=ReleaseKey(PUMS_DAG, "2026-01-31", "income", -1, "pums_income_total"))
    return DashboardLedger(path, tuple(census))


def _charge_id(ledger: Ledger, key: ReleaseKey) -> int:
    [charge] = [c for c in ledger.charges(dag_id=key.dag_id)
                if (c["run_id"], c["task_id"], c["release_name"]) == (key.run_id, key.task_id, key.release_name)]
    return charge["id"]


def _adult_people_by_race(adult_csv: Path) -> list[int]:
    """True counts of UCI Adult's people by race, in the order of :data:`RACES`."""
    counts = dict.fromkeys(RACES, 0)
    with adult_csv.open(newline="") as file:
        for row in csv.DictReader(file, skipinitialspace=True):
            counts[row["race"].strip()] += 1
    return [counts[race] for race in RACES]


def _pums_people_and_income(path: Path) -> tuple[int, int]:
    """The number of people in the PUMS extract and their total income, each clipped to [0, INCOME_BOUND]."""
    if not path.exists():
        pytest.skip(f"{path} not found: the tests read the team's data folder beside the repository")
    people = income = 0
    with path.open(newline="") as file:
        for row in csv.DictReader(file):
            people += 1
            income += min(max(int(float(row["income"])), 0), INCOME_BOUND)
    return people, income


def airflow_env(home: Path, ledger_url: str, port: int) -> dict[str, str]:
    """The api-server's environment: a SQLite metadata database, SimpleAuthManager with :data:`USERS` and their
    passwords file, and the dashboard's ledger connection (``dp_ledger_default``, no key: the dashboard reads)."""
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({name: password for name, (_, password) in USERS.items()}))
    (home / "dags").mkdir(exist_ok=True)
    secret = secrets.token_urlsafe(32)
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    return {
        **inherited,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{name}:{role}" for name, (role, _) in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__SECRET_KEY": secret,
        "AIRFLOW__API_AUTH__JWT_SECRET": secret,
        "AIRFLOW__DP_OPERATORS__DASHBOARD_LEDGER_CONN_ID": "dp_ledger_default",
        "AIRFLOW_CONN_DP_LEDGER_DEFAULT": json.dumps({"conn_type": "dp_ledger", "extra": {"url": ledger_url}}),
    }


@dataclass
class DashboardServer:
    """A running ``airflow api-server`` with the dashboard plugin, at :attr:`base` (``http://127.0.0.1:<port>``)."""

    services: AirflowServices
    base: str

    @classmethod
    @contextmanager
    def running(cls, home: Path, ledger_url: str) -> Iterator[DashboardServer]:
        """Migrate a fresh metadata database in ``home`` and run the api-server until the block ends; enters once
        Airflow answers and the dashboard is mounted (an anonymous request to its API gets 401).

        Raises:
            RuntimeError: a command failed, the server exited or the dashboard is not mounted (the server's log
                tail in the message).
            TimeoutError: the server did not answer within three times the migration's duration (at least 60 s:
                both import Airflow and build its app, so a loaded machine slows both alike).
        """
        port = free_port()
        services = AirflowServices(airflow_env(home, ledger_url, port), home)
        server = cls(services, f"http://127.0.0.1:{port}")
        try:
            started = time.monotonic()
            services.run("airflow", "db", "migrate", timeout=900)  # only bounds a hang
            startup_limit = max(60.0, 3 * (time.monotonic() - started))
            services.start("api-server", "airflow", "api-server", "--host", "127.0.0.1", "--port", str(port))
            try:
                wait_for(lambda: services.check_alive() or server.mounted(), timeout=startup_limit,
                         what="the api-server to serve /dp-budget", retry_on=(httpx.HTTPError,))
            except TimeoutError as error:
                raise TimeoutError(f"{error}\n{server.tail()}") from error
            yield server
        finally:
            services.stop_all(grace=3)  # an api-server has nothing to save; uvicorn waits out open connections

    def mounted(self) -> bool:
        """False while Airflow is starting; True once it answers and the dashboard refuses an anonymous request.

        Raises:
            RuntimeError: Airflow answers but the dashboard is not mounted (the UI's catch-all route serves its
                HTML page for any unknown path, so an unmounted ``/dp-budget`` answers 200 with HTML).
        """
        if httpx.get(f"{self.base}/api/v2/monitor/health", timeout=5).status_code != 200:
            return False
        response = httpx.get(f"{self.base}/dp-budget/api/accounts", timeout=5)
        if response.status_code != 401:
            raise RuntimeError(
                f"Airflow answers but the dashboard is not mounted at /dp-budget (anonymous GET "
                f"/dp-budget/api/accounts: {response.status_code} {response.headers.get('content-type')}); check "
                f"that Airflow loads the plugin: `airflow plugins` must list dp_budget_dashboard\n"
                f"{self.services.tail('api-server')}"
            )
        return True

    def tail(self, lines: int = 80) -> str:
        """The last ``lines`` lines of the api-server's log."""
        return self.services.tails(lines)
