"""The SQLite spend path's statements, run on the pooled ``sqlite3`` connection directly.

A reserve or a commit on SQLite is a dozen small statements in one ``BEGIN IMMEDIATE`` transaction. SQLite runs each
in microseconds; SQLAlchemy's per-statement work (execution context, events, result objects) cost five times the
database's own (``benchmarks/ledger_throughput.py``, ADR 29). The statements are the ledger's own SQLAlchemy Core
constructs (``spend``, ``chain``): :class:`DriverConnection` compiles each once per set of parameter names with the
engine's dialect (SQLAlchemy's compiler, positional parameters), converts values with the column types' own
processors (``TypeEngine.dialect_impl(dialect).bind_processor`` / ``result_processor``: a ``DateTime`` is stored and
read back exactly as through a :class:`~sqlalchemy.engine.Connection`), and sends them with ``sqlite3``. What the
rows hold is therefore byte for byte what the SQLAlchemy path writes (a test compares both ledgers).

Only the calls the spend path makes are offered: ``execute(statement, parameters)`` and, on its result, ``first()``,
``all()`` and ``inserted_primary_key``; rows have attribute access and ``_mapping``. Driver errors are raised as
SQLAlchemy's (:meth:`~sqlalchemy.exc.DBAPIError.instance`, parameters hidden), so callers and the retry of
:meth:`~dp_operators.ledger.store.LedgerBase._write` see the same exceptions on either path. (SQLAlchemy docs,
"Working with Driver SQL and Raw DBAPI Connections".)
"""

from __future__ import annotations

import collections
import operator
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

#: Most compiled statements kept per engine.
MAX_PLANS = 256


def _row_type(names: Sequence[str]) -> type:
    base = collections.namedtuple("Row", names)  # type: ignore[misc]
    return type("Row", (base,), {"__slots__": (), "_mapping": property(lambda row: row._asdict())})


@dataclass(frozen=True)
class _Plan:
    """One statement compiled for one set of parameter names: its SQL, where each positional value comes from (a
    parameter's name, or a constant of the statement) with its type's bind processor, and its result rows' type and
    result processors."""

    statement: ClauseElement  # held so that the id() keying the cache is not reused
    sql: str
    values: Callable[[Mapping[str, Any]], tuple]  # the positional values, from the parameters and constants
    constants: dict[str, Any]
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]  # (position, bind processor)
    row: type | None
    results: tuple[Callable[[Any], Any] | None, ...]
    converts_results: bool
    is_insert: bool

    @classmethod
    def compile(cls, statement: ClauseElement, names: Sequence[str], dialect: Dialect) -> _Plan:
        compiled = statement.compile(dialect=dialect, column_keys=list(names))
        positions = list(compiled.positiontup or ())
        constants, processors = {}, []
        for index, name in enumerate(positions):
            bind = compiled.binds[name]
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors.append((index, processor))
            if name not in names:  # a constant of the statement (``state = 'reserved'``)
                constants[name] = bind.effective_value
        getter = operator.itemgetter(*positions) if positions else (lambda _: ())
        values = (lambda parameters: (getter(parameters),)) if len(positions) == 1 else getter
        row, results = None, ()
        if isinstance(statement, sa.Select):
            columns = list(statement.selected_columns)
            row = _row_type([column.key for column in columns])
            results = tuple(column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns)
        return cls(statement, compiled.string, values, constants, tuple(processors), row, results, any(results),
                   isinstance(statement, sa.Insert))


class DriverResult:
    """The rows of one statement (fetched at once: the spend path's reads return a row or a few), or an insert's
    new id."""

    __slots__ = ("_rows", "_lastrowid")

    def __init__(self, rows: list, lastrowid: int | None) -> None:
        self._rows = rows
        self._lastrowid = lastrowid

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def all(self) -> list:
        return self._rows

    @property
    def inserted_primary_key(self) -> tuple[int | None]:
        return (self._lastrowid,)


class DriverConnection:
    """``execute(statement, parameters)`` of SQLAlchemy Core statements on a ``sqlite3`` connection (see the module
    docstring). ``plans`` is the compiled-statement cache, shared by the connections of one engine."""

    def __init__(self, connection: sqlite3.Connection, dialect: Dialect, plans: dict) -> None:
        self._connection = connection
        self._dialect = dialect
        self._plans = plans

    def savepoint(self, name: str, action: str = "SAVEPOINT") -> None:
        """``SAVEPOINT name``, ``ROLLBACK TO name`` or ``RELEASE name`` (``action``) inside the open transaction: a
        charge on several member accounts (privacy blocks, quotas) is undone whole when one of them refuses."""
        if action not in ("SAVEPOINT", "ROLLBACK TO", "RELEASE") or not name.isidentifier():
            raise ValueError(f"bad savepoint statement {action} {name}")
        try:
            self._connection.execute(f"{action} {name}")
        except sqlite3.Error as error:
            raise driver_error(error, self._dialect, f"{action} {name}", ()) from error

    def execute(self, statement: ClauseElement, parameters: Mapping[str, Any] | None = None) -> DriverResult:
        parameters = parameters or {}
        key = (id(statement), tuple(parameters))
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:  # only module-level statements come here; a bound all the same
                self._plans.clear()
            plan = self._plans[key] = _Plan.compile(statement, tuple(parameters), self._dialect)
        values = plan.values({**parameters, **plan.constants} if plan.constants else parameters)
        if plan.processors:
            values = list(values)
            for index, processor in plan.processors:
                if values[index] is not None:
                    values[index] = processor(values[index])
        try:
            cursor = self._connection.execute(plan.sql, values)
            rows = cursor.fetchall() if plan.row is not None else []
        except sqlite3.Error as error:
            raise driver_error(error, self._dialect, plan.sql, values) from error
        if plan.row is None:
            return DriverResult([], cursor.lastrowid if plan.is_insert else None)
        if plan.converts_results:
            results = plan.results
            rows = [[value if convert is None or value is None else convert(value)
                     for convert, value in zip(results, row)] for row in rows]
        make = plan.row._make
        return DriverResult([make(row) for row in rows], None)


def driver_error(
    error: sqlite3.Error, dialect: Dialect, statement: str | None = None, parameters: Any = None
) -> sa.exc.DBAPIError:
    """``error`` as SQLAlchemy raises it (``OperationalError``, ``IntegrityError``, ...): the statement named, its
    parameters hidden (they hold amounts and mechanisms)."""
    return sa.exc.DBAPIError.instance(
        statement, parameters, error, sqlite3.Error, hide_parameters=True, dialect=dialect
    )
