"""``config/ledgers.yaml``: budget accounts governed by privacy officers (DESIGN.md 2.10).

A release spec names an account and asks for a spend; the cap, the accountant and the DAGs allowed to spend live
here, and reach the ledger only through ``dpctl ledger apply``. A spec cannot raise a cap.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from dp_operators.accounting import exact_number


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

    Attributes:
        accountant: ``pure_dp`` (cap in epsilon) or ``zcdp`` (cap in rho); fixed once the account exists.
        cap: total budget in the accountant's unit.
        delta: for ``zcdp``, the delta at which spend is also reported as epsilon.
        privacy_unit: what one contribution bound protects (must match the specs that spend from it).
        allowed_dags: DAG ids allowed to spend; any other DAG is refused before anything is reserved.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    accountant: Literal["pure_dp", "zcdp"]
    cap: Annotated[Fraction, BeforeValidator(_positive)]
    delta: Annotated[Fraction, BeforeValidator(_delta)] | None = None
    privacy_unit: str
    allowed_dags: list[str] = Field(min_length=1)
    owner: str | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _delta_for_zcdp_only(self) -> AccountConfig:
        if self.accountant == "pure_dp" and self.delta is not None:
            raise ValueError("a pure_dp account has no delta; remove 'delta' or use accountant 'zcdp'")
        return self


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
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise LedgerConfigError(f"{path}: cannot read: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise LedgerConfigError(f"{path}: not valid YAML: {error}") from None
    try:
        return LedgerConfig.model_validate(document)
    except ValidationError as error:
        lines = [f"{path}: invalid ledger configuration:"]
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"] if not str(part).startswith("function-"))
            lines.append(f"  {where or '(document)'}: {problem['msg'].removeprefix('Value error, ')}")
        raise LedgerConfigError("\n".join(lines)) from None
