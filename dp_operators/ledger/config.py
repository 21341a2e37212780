"""``config/ledgers.yaml``: budget accounts governed by privacy officers (DESIGN.md 2.10).

A release spec names an account and asks for a spend; the cap, the accountant and the DAGs allowed to spend live
here, and reach the ledger only through ``dpctl ledger apply``. A spec cannot raise a cap.
"""

from __future__ import annotations

import datetime as dt
import math
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from dp_operators.accounting import exact_number
from dp_operators.ledger import structure
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


class BlockOpening(BaseModel):
    """Which blocks ``dpctl ledger apply`` opens: calendar windows ``from`` a date ``until`` a date (inclusive), or
    ``ahead`` windows past today (the policy "open blocks for windows not yet started": run apply on a schedule),
    or the ``partitions`` named."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: dt.date | None = Field(default=None, alias="from")
    until: dt.date | None = None
    ahead: int | None = Field(default=None, ge=0, le=structure.MAX_OPEN_BLOCKS)
    partitions: list[str] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_way(self) -> BlockOpening:
        if self.partitions is not None:
            if self.from_ is not None or self.until is not None or self.ahead is not None:
                raise ValueError("give either 'partitions' or calendar windows ('from' with 'until' or 'ahead')")
            for key in self.partitions:
                if not structure.PARTITION_KEY.fullmatch(key):
                    raise ValueError(f"partition key {key!r} cannot name a block: 1-64 letters, digits, '_', '.', '-'")
            return self
        if self.from_ is None or (self.until is None) == (self.ahead is None):
            raise ValueError("give 'from' (the first window's date) and exactly one of 'until' (a date) or 'ahead' "
                             "(windows past today)")
        if self.until is not None and self.until < self.from_:
            raise ValueError(f"'until' {self.until} is before 'from' {self.from_}")
        return self

    def windows(self, granularity: str, today: dt.date | None = None) -> list[str]:
        """The windows whose blocks are open under this policy (``today`` defaults to the UTC date)."""
        if granularity == "partition":
            if self.partitions is None:
                raise ValueError("partition blocks are opened by naming them: open: {partitions: [...]}")
            return sorted(set(self.partitions))
        if self.partitions is not None:
            raise ValueError(f"{granularity} blocks are opened by dates ('from', 'until' or 'ahead'), not partitions")
        assert self.from_ is not None
        if self.until is not None:
            return structure.windows_between(granularity, self.from_, self.until)
        today = today or dt.datetime.now(dt.timezone.utc).date()
        windows = structure.windows_between(granularity, self.from_, today)
        for _ in range(self.ahead or 0):
            windows.append(structure._next_window(granularity, windows[-1]))
        return windows


class Blocks(BaseModel):
    """Privacy blocks of an account (:mod:`dp_operators.ledger.structure`): one member account per data window,
    each with the account's ``cap``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: Literal["day", "week", "month", "partition"]
    open: BlockOpening

    @model_validator(mode="after")
    def _opens_windows_of_its_kind(self) -> Blocks:
        if self.window == "partition" and self.open.partitions is None:
            raise ValueError("partition blocks are opened by naming them: open: {partitions: [key, ...]}")
        if self.window != "partition" and self.open.partitions is not None:
            raise ValueError(f"{self.window} blocks are opened by dates: open: {{from: DATE, until: DATE}} or "
                             "{from: DATE, ahead: N}; partitions are for window: partition")
        if self.window != "partition" and self.open.until is not None:
            count = len(structure.windows_between(self.window, self.open.from_, min(
                self.open.until, self.open.from_ + dt.timedelta(days=31 * structure.MAX_OPEN_BLOCKS))))
            if count >= structure.MAX_OPEN_BLOCKS:
                raise ValueError(f"opens more than {structure.MAX_OPEN_BLOCKS} {self.window} blocks at once (the "
                                 "ledger's limit): open a shorter range, or use 'ahead: N' and run apply on a schedule")
        return self

    def as_record(self) -> dict:
        return {"window": self.window}


class Quota(BaseModel):
    """A team's quota within an account's cap: the DAGs it covers and, on PostgreSQL, the team role its workers
    log in with (checked by the database). On an ``approx_dp`` account a quota also holds a share of the account's
    delta, ``delta``: by default the account's delta times the quota's share of the cap (``cap / account cap``), so
    that quotas that fit in the cap fit in its delta too, and no team can spend the delta another team's releases
    need (partition selection spends delta)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cap: Annotated[Fraction, BeforeValidator(_positive)]
    dags: list[str] = Field(min_length=1)
    role: str | None = None
    delta: Annotated[Fraction, BeforeValidator(_delta)] | None = None

    @field_validator("role")
    @classmethod
    def _plain_role(cls, role: str | None) -> str | None:
        if role is not None and (problem := role_name_problem(role)) is not None:
            raise ValueError(f"role {role!r} {problem}")
        return role

    def as_record(self) -> dict:
        return {"cap": str(self.cap), "dags": sorted(self.dags), **({} if self.role is None else {"role": self.role}),
                **({} if self.delta is None else {"delta": str(self.delta)})}


class Approval(BaseModel):
    """An officer's approval before a large charge (docs/ledger.md, "Approval before a large charge"): a charge
    above ``above`` (in the account's unit), or above ``above_fraction_of_remaining`` of the budget left before it,
    or (``on_mechanism_change``) whose mechanisms differ from the last committed charge of the same DAG, task, map
    index and release name on the account, is reserved only once a privacy officer granted it (``dpctl ledger
    approve``, signed with the governor key). A request left undecided ``timeout_hours`` after it was filed counts
    as rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    above: Annotated[Fraction, BeforeValidator(_positive)] | None = None
    above_fraction_of_remaining: Annotated[Fraction, BeforeValidator(_positive)] | None = None
    on_mechanism_change: bool = False
    timeout_hours: Annotated[Fraction, BeforeValidator(_positive)] = Fraction(24)

    @model_validator(mode="after")
    def _some_trigger(self) -> Approval:
        if self.above is None and self.above_fraction_of_remaining is None and not self.on_mechanism_change:
            raise ValueError("give at least one of 'above', 'above_fraction_of_remaining' or "
                             "'on_mechanism_change: true'")
        if self.above_fraction_of_remaining is not None and self.above_fraction_of_remaining > 1:
            raise ValueError("'above_fraction_of_remaining' is a fraction in (0, 1]")
        if self.timeout_hours > 24 * 90:
            raise ValueError("'timeout_hours' is at most 2160 (90 days)")
        for name in ("above", "above_fraction_of_remaining", "timeout_hours"):
            value = getattr(self, name)
            if value is not None and (value.denominator > 10**18 or value.numerator >= 10**40):
                raise ValueError(f"'{name}' has too many digits")
        return self

    def as_record(self) -> dict:
        return {
            **({} if self.above is None else {"above": str(self.above)}),
            **({} if self.above_fraction_of_remaining is None
               else {"above_fraction_of_remaining": str(self.above_fraction_of_remaining)}),
            "on_mechanism_change": self.on_mechanism_change,
            "timeout_hours": str(self.timeout_hours),
        }


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
        approval: an officer's approval before a large charge (:class:`Approval`; docs/ledger.md, "Approval before
            a large charge"); recorded only when set.
        require_enforced_bounding: every charge must have enforced its contribution bounds (the operator read the
            rows with ``table`` and ``privacy_unit_column`` and bounded each unit's contributions itself); a charge
            with a step whose bounds were only declared (hand-written aggregate queries, upstream aggregates) is
            refused by the database before anything is reserved (docs/ledger.md, "Requiring enforced contribution
            bounding"). A policy, not a structure: it may be set or lifted at any time. Recorded only when true,
            and carried by the account's members (blocks, quotas).
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
    blocks: Blocks | None = None
    quotas: dict[str, Quota] | None = None
    approval: Approval | None = None
    require_enforced_bounding: bool = False

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
        if self.blocks is not None and self.quotas is not None:
            raise ValueError("an account has privacy blocks or team quotas, not both (yet): split it in two accounts")
        if self.quotas is not None:
            if not self.quotas:
                raise ValueError("'quotas' names at least one team")
            listed: dict[str, str] = {}
            for team, quota in sorted(self.quotas.items()):
                if not structure.PARTITION_KEY.fullmatch(team):
                    raise ValueError(f"team name {team!r}: 1-64 letters, digits, '_', '.', '-'")
                in_unit = quota.cap * quota.cap if self.accountant == "gaussian_dp" else quota.cap
                if in_unit > self.cap_in_unit():
                    raise ValueError(
                        f"quota of team {team!r} ({quota.cap}) is above the account's cap ({self.cap_in_unit()} in "
                        f"the account's unit): a quota is in the unit of 'cap' (rho for zcdp, even when the account "
                        "gives 'epsilon'; mu for gaussian_dp)")
                if quota.delta is not None and self.accountant != "approx_dp":
                    raise ValueError(f"quota of team {team!r} gives a delta, which only an approx_dp account spends "
                                     f"(a {self.accountant} account's delta is the one its epsilon is read at)")
                if quota.delta is not None and quota.delta > self.delta:  # type: ignore[operator]
                    raise ValueError(f"quota of team {team!r} has delta {quota.delta}, above the account's delta "
                                     f"{self.delta}")
                for dag in quota.dags:
                    if dag in listed:
                        raise ValueError(f"DAG {dag!r} is in the quotas of both {listed[dag]!r} and {team!r}: a DAG "
                                         "spends one team's quota")
                    listed[dag] = team
            if sorted(listed) != sorted(set(self.allowed_dags)):
                missing = sorted(set(self.allowed_dags) - set(listed)) or sorted(set(listed) - set(self.allowed_dags))
                raise ValueError(f"with quotas, allowed_dags must be exactly the DAGs of the teams' quotas (differs "
                                 f"in {missing[:5]})")
        return self

    def members(self, name: str, today: dt.date | None = None) -> dict[str, AccountConfig]:
        """The member accounts this account stands for (``{name: config}``): a block per open window, or a quota
        per team; each records which account and part it is (``part_of``)."""
        base = {
            "accountant": self.accountant, "cap": self.cap, "epsilon": self.epsilon, "delta": self.delta,
            "privacy_unit": self.privacy_unit, "allowed_dags": self.allowed_dags, "allowed_roles": self.allowed_roles,
            "owner": self.owner, "require_enforced_bounding": self.require_enforced_bounding,
        }
        out: dict[str, AccountConfig] = {}
        if self.blocks is not None:
            for window in self.blocks.open.windows(self.blocks.window, today):
                out[structure.block_account(name, window)] = MemberAccountConfig(
                    **base, approval=getattr(self, "approval", None),  # each block checks it; grants on the account
                    description=f"privacy block {window} ({self.blocks.window}) of account {name}",
                    part_of={"account": name, "block": window, "window": self.blocks.window},
                )
        for team, quota in sorted((self.quotas or {}).items()):
            member = {**base, "cap": quota.cap, "epsilon": None, "allowed_dags": quota.dags,
                      "allowed_roles": [quota.role] if quota.role else self.allowed_roles}
            if self.accountant == "approx_dp":  # the team's share of the delta (Quota)
                member["delta"] = self.quota_delta(quota)
            out[structure.quota_account(name, team)] = MemberAccountConfig(
                **member, description=f"quota of team {team} in account {name}",
                part_of={"account": name, "quota": team},
            )
        return out

    def quota_delta(self, quota: Quota) -> Fraction:
        """The delta a quota of this ``approx_dp`` account may spend: its own ``delta``, else the account's delta
        times ``quota.cap / cap`` (rounded down to a multiple of 10^-18, the ledger's finest denominator)."""
        if quota.delta is not None:
            return quota.delta
        share = self.delta * quota.cap / self.cap_in_unit()  # type: ignore[operator]
        return share if share.denominator <= 10**18 else Fraction(math.floor(share * 10**18), 10**18)

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
            **({} if self.blocks is None else {"blocks": self.blocks.as_record()}),
            **({} if self.quotas is None else {"quotas": {t: q.as_record() for t, q in sorted(self.quotas.items())}}),
            # only when set, so the record of an account without an approval policy is unchanged
            **({} if self.approval is None else {"approval": self.approval.as_record()}),
            # only when true, so the record of an account that does not require it is unchanged
            **({structure.REQUIRE_ENFORCED_BOUNDING: True} if self.require_enforced_bounding else {}),
        }


class MemberAccountConfig(AccountConfig):
    """A member account (a privacy block or a team quota) as :meth:`AccountConfig.members` makes it; never written
    in ``ledgers.yaml``."""

    part_of: dict[str, str]

    def as_record(self) -> dict:
        return {**super().as_record(), "part_of": dict(sorted(self.part_of.items()))}


class LedgerConfig(BaseModel):
    """The ``ledgers.yaml`` document: ``version: 1`` and ``accounts: {name: AccountConfig}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1]
    accounts: dict[str, AccountConfig] = Field(min_length=1)

    @field_validator("accounts")
    @classmethod
    def _names(cls, accounts: dict[str, AccountConfig]) -> dict[str, AccountConfig]:
        for name in accounts:
            if structure.MEMBER_SEPARATOR in name:
                raise ValueError(f"account name {name!r}: {structure.MEMBER_SEPARATOR!r} is kept for the members "
                                 "(blocks and quotas) the ledger makes of an account")
        return accounts

    def all_accounts(self, today: dt.date | None = None) -> dict[str, AccountConfig]:
        """Every account the configuration stands for: each account, then its members (blocks, quotas)."""
        out: dict[str, AccountConfig] = {}
        for name, account in self.accounts.items():
            out[name] = account
            out.update(account.members(name, today))
        return out


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
