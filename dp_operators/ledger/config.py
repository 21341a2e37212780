"""``config/ledgers.yaml``: budget accounts governed by privacy officers (DESIGN.md 2.10).

A release spec names an account and asks for a spend; the cap, the accountant and the DAGs allowed to spend live
here, and reach the ledger only through ``dpctl ledger apply``. A spec cannot raise a cap.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from dp_operators.accounting import exact_number
from dp_operators.ledger.team_roles import role_name_problem
from dp_operators.spec.yaml12 import YAMLDocumentError, document_kind, load_yaml


def _positive(value: object) -> Fraction:
    number = exact_number(value, name="value")
    if number <= 0:
        raise ValueError(f"must be > 0, got {value!r}")
    return number


def _delta(value: object) -> Fraction:
    number = exact_number(value, name="delta")
    if not 0 < number < 1:
        raise ValueError(f"delta must be in (0, 1), got {value!r}")
    return number


class AccountConfig(BaseModel):
    """One budget account.

    The cap is given either as ``cap`` in the accountant's own terms, or as an ``epsilon`` target that, with
    ``delta``, is converted to the largest cap in the account's unit whose guarantee implies (epsilon, delta)-DP:

    ============  ==========================  ====================================================================
    accountant    ``cap`` means               ``epsilon`` (+ ``delta``) becomes
    ============  ==========================  ====================================================================
    pure_dp       epsilon                     the same epsilon (no delta allowed)
    approx_dp     epsilon (``delta`` is the   the same epsilon; ``delta`` is required: the delta cap
                  delta cap, required)
    zcdp          rho                         the largest rho with CKS(rho, delta) <= epsilon, 12 significant
                                              digits, rounded down (Canonne, Kamath & Steinke 2020, Cor. 13)
    gaussian_dp   mu (stored as mu^2 = cap^2) the largest mu^2 with delta_mu(epsilon) <= delta, 12 significant
                                              digits, rounded down (Dong, Roth & Su 2019, Cor. 2.13)
    ============  ==========================  ====================================================================

    For ``zcdp`` and ``gaussian_dp`` ``delta`` is also the delta at which spend is reported as epsilon.

    Attributes:
        accountant: ``pure_dp``, ``approx_dp``, ``zcdp`` or ``gaussian_dp``; fixed once the account exists.
        cap, epsilon: the budget, exactly one of the two (see the table).
        delta: see the table.
        privacy_unit: what one contribution bound protects (must match the specs that spend from it).
        allowed_dags: DAG ids allowed to spend; any other DAG is refused before anything is reserved. The DAG id
            is what the worker says it runs: a guard against mistakes, not against a DAG author who claims another
            DAG's id.
        allowed_roles: database roles (PostgreSQL) whose members may spend from the account, e.g. ``[team_census]``:
            the team roles that ``dpctl ledger roles --config`` creates as members of the spender role. The database
            checks the worker's login against them, whatever DAG id the worker claims, so a team whose workers log
            in as members of another team role cannot spend this account. ``None`` (left out): any login holding
            the spender role may spend. Plain role names: 1-63 letters, digits and underscores, starting with a
            letter or an underscore (case-sensitive, as quoted identifiers); not ``public``, ``none``,
            ``current_user``, ``session_user``, ``current_role`` or ``pg_*``. On SQLite the list is recorded and
            signed but not enforced: whoever can write the ledger file governs it (docs/ledger.md, "Team roles").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    accountant: Literal["pure_dp", "approx_dp", "zcdp", "gaussian_dp"]
    cap: Annotated[Fraction, BeforeValidator(_positive)] | None = None
    epsilon: Annotated[Fraction, BeforeValidator(_positive)] | None = None
    delta: Annotated[Fraction, BeforeValidator(_delta)] | None = None
    privacy_unit: str
    allowed_dags: list[str] = Field(min_length=1)
    allowed_roles: list[str] | None = None
    owner: str | None = None
    description: str | None = None

    @field_validator("allowed_roles")
    @classmethod
    def _plain_role_names(cls, roles: list[str] | None) -> list[str] | None:
        if roles is None:
            return None
        if not roles:
            raise ValueError(
                "an empty list would let nobody spend: name the team roles whose members may spend (e.g. "
                "[team_census]), or leave allowed_roles out to let any login holding the spender role spend"
            )
        for role in roles:
            problem = role_name_problem(role)
            if problem is not None:
                raise ValueError(
                    f"role {role!r} {problem}; allowed_roles names the database roles (one per team, e.g. "
                    "team_census) whose members may spend from this account"
                )
        return roles

    @model_validator(mode="after")
    def _consistent(self) -> AccountConfig:
        if (self.cap is None) == (self.epsilon is None):
            raise ValueError("give exactly one of 'cap' (in the accountant's unit) or 'epsilon' (with 'delta')")
        if self.accountant == "pure_dp" and self.delta is not None:
            raise ValueError("a pure_dp account has no delta; remove 'delta' or use accountant 'approx_dp'")
        if self.accountant == "approx_dp" and self.delta is None:
            raise ValueError("an approx_dp account needs 'delta': the total delta it may spend")
        if self.epsilon is not None and self.accountant in ("zcdp", "gaussian_dp") and self.delta is None:
            raise ValueError(f"a {self.accountant} cap given as 'epsilon' needs the 'delta' it holds at")
        return self

    def cap_in_unit(self) -> Fraction:
        """The cap in the account's unit (epsilon, rho or mu^2), converted as the class docstring says."""
        if self.accountant in ("pure_dp", "approx_dp"):
            return self.cap if self.cap is not None else self.epsilon  # type: ignore[return-value]
        if self.accountant == "zcdp":
            if self.cap is not None:
                return self.cap
            from dp_operators.mechanisms.calibration import rho_for_approx_dp

            return rho_for_approx_dp(self.epsilon, self.delta)  # type: ignore[arg-type]
        if self.cap is not None:
            return self.cap * self.cap
        from dp_operators.accounting.gaussian_dp import gdp_mu_squared_for_approx_dp

        return gdp_mu_squared_for_approx_dp(self.epsilon, self.delta)  # type: ignore[arg-type]

    def as_record(self) -> dict:
        """The configuration as written, JSON-safe (exact numbers as strings); recorded in the audit log."""
        return {
            "accountant": self.accountant,
            "cap": None if self.cap is None else str(self.cap),
            "epsilon": None if self.epsilon is None else str(self.epsilon),
            "delta": None if self.delta is None else str(self.delta),
            "privacy_unit": self.privacy_unit,
            "allowed_dags": sorted(self.allowed_dags),
            # only when written, so the record (and the stored ``config``) of an account without it is unchanged
            **({} if self.allowed_roles is None else {"allowed_roles": sorted(set(self.allowed_roles))}),
            "owner": self.owner,
            "description": self.description,
        }


class LedgerConfig(BaseModel):
    """The ``ledgers.yaml`` document: ``version: 1`` and ``accounts: {name: AccountConfig}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1]
    accounts: dict[str, AccountConfig] = Field(min_length=1)


class LedgerConfigError(ValueError):
    """``ledgers.yaml`` is invalid; the message names the file and the field path."""


def load_ledger_config(path: str | Path) -> LedgerConfig:
    """Load and validate a ledger configuration file.

    Raises:
        LedgerConfigError: unreadable file, invalid YAML or a failing field (file and field path in the message).
    """
    path = Path(path)
    try:
        document = load_yaml(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise LedgerConfigError(f"{path}: cannot read: {error.strerror}") from None
    except YAMLDocumentError as error:  # YAML 1.2: 'allowed_dags: [on]' is the DAG id "on"
        raise LedgerConfigError(error.describe(str(path))) from None
    if not isinstance(document, dict):
        raise LedgerConfigError(
            f"{path}: invalid ledger configuration: expected a mapping with 'version: 1' and 'accounts:', found "
            f"{document_kind(document)} (an example: config/ledgers.yaml; the fields: docs/ledger.md)"
        )
    try:
        return LedgerConfig.model_validate(document)
    except ValidationError as error:
        lines = [f"{path}: invalid ledger configuration:"]
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"] if not str(part).startswith("function-"))
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "extra_forbidden":
                message = "unknown field (check the spelling; see docs/ledger.md)"
            lines.append(f"  {where or '(document)'}: {message}")
        raise LedgerConfigError("\n".join(lines)) from None


def declared_accountants(path: str | Path) -> dict[str, str]:
    """``{account: accountant}`` as written in a ledger configuration file, without validating anything else
    (empty if the file cannot be read or is not shaped like one). Lets ``dpctl ledger apply`` report a changed
    accountant even when the rest of the changed account fails validation."""
    try:
        document = load_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, YAMLDocumentError):
        return {}
    accounts = document.get("accounts") if isinstance(document, dict) else None
    if not isinstance(accounts, dict):
        return {}
    return {
        str(name): account["accountant"]
        for name, account in accounts.items()
        if isinstance(account, dict) and isinstance(account.get("accountant"), str)
    }
