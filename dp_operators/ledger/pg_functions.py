"""The ledger's spend functions on PostgreSQL: the spender role executes them and writes no table (docs/adr/0029).

Each spend call of :class:`~dp_operators.ledger.spend.Ledger` is one call of one PL/pgSQL function, in one
transaction: ``dp_reserve``, ``dp_commit``, ``dp_release``, ``dp_abandon``, ``dp_renew`` and ``dp_reconcile``. The
functions belong to the tables' owner (the role that ran ``dpctl ledger init``), run with its rights (``SECURITY
DEFINER``) and pin their ``search_path`` to the ledger's schema, then ``pg_temp`` (PostgreSQL documentation, CREATE
FUNCTION, "Writing SECURITY DEFINER Functions Safely"). Only the spender may execute the six
(:mod:`dp_operators.ledger.roles`); the helpers they call may be executed by nobody else.

What a function does is what the Python path of :mod:`~dp_operators.ledger.spend` does on SQLite, step for step:
check the caller's team role (``allowed_roles``; before any lock of the account or its charges, so another team's
login neither holds nor waits for the account's lock), lock the account row, compare it with the head of its
audit chain, check the spend key, the allowlist, a committed output to replay, a live lease, the budget (exact
fractions, rounded as :func:`~dp_operators.accounting.round_up` and ``round_down`` round), the reservation token
and the state machine. It computes the running totals, ``audit_seq``, ``prev_hash`` and each event's MAC itself
(HMAC-SHA256 of the canonical JSON :func:`~dp_operators.ledger.chain.audit_row_mac` signs, built in SQL: pgcrypto's
``hmac``), stamps time with the database's clock and the caller with ``session_user`` (the context's ``db_role``),
and bounds every input (JSON holds only numbers the ledger's readers read: finite doubles, integers of at most
4,300 digits). So the spender cannot write a row the ledger would not write: it has no INSERT, UPDATE or
DELETE on any table (the functions do the writing), and a function refuses anything the state machine refuses.

Calls on one account queue on a row no spend changes (the account's first audit event) before they lock the
account's row, so each commit wakes one waiter, not all of them (:func:`_lock`); what needs no lock (the checks of
the arguments, the contexts, the output's digest) is done before it, and the stored numbers are read once per call.

Refusals that are recorded (a DAG not allowed, budget exhausted) return a status and commit their ``refused``
event; every other refusal raises one of the SQLSTATEs below, naming its parameters in the error's DETAIL (JSON),
and writes nothing; :mod:`~dp_operators.ledger.spend` maps them to the ledger's exceptions.

The spend key is an argument of every function (the database does not keep it): see the ADR for who can see it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dp_operators.accounting import ACCOUNTANTS, MAX_DENOMINATOR
from dp_operators.ledger import schema, structure
from dp_operators.ledger.bounded import MAX_DIGITS, MAX_OUTPUT_CHARS
from dp_operators.ledger.bounded import MAX_JSON_DEPTH as READER_JSON_DEPTH
from dp_operators.ledger.chain import AUDIT_CONTEXT_KEYS, GENESIS_HASH

#: SQLSTATEs the functions raise (class ``DP``, outside PostgreSQL's own classes), by what they mean.
ACCOUNT_NOT_FOUND = "DPL01"
KEY_REFUSED = "DPL02"
CHARGE_STATE = "DPL03"
LEASE_HELD = "DPL04"
CHAIN_BROKEN = "DPL05"
BAD_VALUE = "DPL06"
ROLE_NOT_ALLOWED = "DPL07"

#: Bounds of the functions' inputs (an output: what the ledger's readers accept, bounded.MAX_OUTPUT_CHARS and
#: bounded.MAX_JSON_DEPTH).
MAX_MECHANISMS_CHARS = 64 * 1024
MAX_JSON_DEPTH = 16
MAX_CONTEXT_BYTES = 16 * 1024
MAX_CONTEXT_VALUE_CHARS = 1000
MAX_AMOUNT_NUMERATOR_DIGITS = 40
MAX_KEY_BYTES = 4096
MAX_TOKEN_CHARS = 100  # dp_audit_events.proof holds the token
#: Most digits of a JSON integer the readers convert: Python's int-string limit
#: (``sys.int_info.default_max_str_digits``; ``bounded.read_json`` refuses a longer one).
MAX_JSON_INTEGER_DIGITS = 4300
#: The digits of 2^1024 - 2^970: Python's ``float()`` reads a decimal number of smaller magnitude as a finite double
#: (at most the largest, 1.7976931348623157e308), this one and any larger as ``inf``, which the readers refuse.
_DOUBLE_LIMIT_DIGITS = str(2**1024 - 2**970).rstrip("0")
#: A JSON number (in text whose strings are removed) that could be beyond the readers: an exponent of 3 or more
#: digits, or 25 or more characters before any exponent. Every other number is within 10^-125 and 10^125. The
#: lookahead makes each match a whole number (a longer match of the same number would match from its start).
_SUSPECT_NUMBER = (
    r"-?[0-9]+(?:\.[0-9]+)?[eE][-+]?[0-9]{3,}(?![0-9.eE+-])|-?[0-9.]{25,}(?:[eE][-+]?[0-9]+)?(?![0-9.eE+-])"
)

#: The bytes :attr:`~dp_operators.ledger.keys.AuditKey.key_id` puts before the secret (a test checks the two agree).
KEY_ID_DOMAIN = b"dp-operators audit key id\0"


@dataclass(frozen=True)
class Function:
    """One function of the ledger: ``CREATE OR REPLACE FUNCTION name(args) RETURNS returns`` with ``body``."""

    name: str
    args: str
    returns: str
    body: str
    language: str = "plpgsql"
    volatility: str = "VOLATILE"
    definer: bool = False

    @property
    def identity(self) -> str:
        """The argument types, as ``GRANT``/``REVOKE ... ON FUNCTION name(types)`` takes them."""
        return ", ".join(arg.strip().split(" ", 1)[1] for arg in self.args.split(",")) if self.args else ""

    @property
    def signature(self) -> str:
        return f"{self.name}({self.identity})"

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(arg.strip().split(" ", 1)[0] for arg in self.args.split(",")) if self.args else ()

    def source(self, crypto_schema: str) -> str:
        """The body as stored (``pg_proc.prosrc``), pgcrypto's schema filled in."""
        return self.body.replace("@CRYPTO@", crypto_schema)

    def ddl(self, ledger_schema: str, crypto_schema: str) -> list[str]:
        """``CREATE OR REPLACE`` it, pinned to ``ledger_schema`` (quoted), and revoke it from PUBLIC."""
        definer = " SECURITY DEFINER" if self.definer else ""
        return [
            f"CREATE OR REPLACE FUNCTION {self.name}({self.args}) RETURNS {self.returns} LANGUAGE {self.language} "
            f"{self.volatility}{definer} SET search_path = {ledger_schema}, pg_temp AS $fn${self.source(crypto_schema)}$fn$",
            f"REVOKE ALL ON FUNCTION {self.signature} FROM PUBLIC",
        ]


def _fail(code: str, message: str, detail: str) -> str:
    """A PL/pgSQL statement raising ``code`` with ``message`` (a ``format()`` call or literal) and ``detail`` (jsonb)."""
    return f"PERFORM dp_fail('{code}', {message}, {detail});"


_KEY_MATCHES = (
    "x.dag_id = p_dag_id AND x.run_id = p_run_id AND x.task_id = p_task_id AND x.map_index = p_map_index "
    "AND x.release_name = p_release_name"
)
#: A release key's charges on the caller's account only: another account's charges of the same key (another team
#: whose DAG id is allowed on an account of its own) are neither replayed, nor waited for, nor taken over.
_OF_ACCOUNT = "x.account = p_account"
_RELEASE_KEY_ARGS = "p_dag_id text, p_run_id text, p_task_id text, p_map_index integer, p_release_name text"
_OWNER_ARGS = (
    f"p_key bytea, p_charge_id bigint, p_account text, {_RELEASE_KEY_ARGS}, p_attempt integer, p_token text"
)
_M = str(MAX_DENOMINATOR)
_MAX_LEASE = schema.MAX_LEASE_SECONDS

_EVENT_COLUMNS = [c.name for c in schema.audit_events.c if c.name != "id"]
_INTEGER_COLUMNS = {c.name for c in schema.audit_events.c if c.type.python_type is int}


_ACCOUNTANT_UNITS = " ".join(f"WHEN '{name}' THEN '{unit}'" for name, unit in sorted(ACCOUNTANTS.items()))
_CONTEXT_KEYS = ", ".join(f"'{key}'" for key in sorted(AUDIT_CONTEXT_KEYS))


def _live(now: str) -> str:
    """SQL: the charge ``x`` holds a live lease at ``now`` (one beyond MAX_LEASE_SECONDS is tampered: expired)."""
    return f"(x.lease_expires_at > {now} AND x.lease_expires_at <= {now} + interval '{_MAX_LEASE} seconds')"


def _canonical_event_json() -> str:
    """SQL building :func:`~dp_operators.ledger.chain.audit_row_mac`'s message from an event ``e``: Python's
    ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` of the hashed columns (``to_json`` of
    text escapes as Python does without ``ensure_ascii``: ``\\"``, ``\\\\``, ``\\b\\f\\n\\r\\t``, other controls
    as lowercase ``\\u00xx``, nothing else). One ``concat`` (it writes a ``json`` value as its text), ``null`` for
    each NULL column."""
    parts = []
    for i, name in enumerate(sorted(schema.AUDIT_HASHED_COLUMNS)):
        if name in _INTEGER_COLUMNS:
            value = f"coalesce(e.{name}::text, 'null')"
        else:
            value = f"coalesce(to_json(e.{name}), 'null'::json)"
        parts.append(f"'{',' if i else '{'}\"{name}\":', {value}")
    assert 2 * len(parts) + 1 <= 100, "concat takes at most 100 arguments (FUNC_MAX_ARGS)"
    return "concat(" + ", ".join(parts) + ", '}')"


# ---- PL/pgSQL fragments ------------------------------------------------------------------------------------------
# The steps a spend function takes on every call are written into its body from these fragments rather than called
# as helpers: a call of a function pinned to the schema sets the search_path and back, and a PERFORM of a void
# helper is a query of its own. The helpers that name the same steps (dp_check_head, dp_lock_account, dp_append, ...)
# are built from the same fragments, and the rarer paths (a refusal's message, a tampered number) still call the
# helpers, so each check has one text. Same checks, same order, same messages, same rows. Larger steps a call takes
# more than once stay helpers (dp_event_mac: PL/pgSQL sets an expression up once per transaction).


def _ts_text(at: str) -> str:
    """SQL: the timestamp ``at`` as the audit rows write it (:func:`~dp_operators.ledger.chain.timestamp_text`)."""
    return f"""to_char(({at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00'"""


def _q_text(q: str) -> str:
    """SQL: str(Fraction) of the fraction ``q`` (numeric[] {numerator, denominator > 0}, in lowest terms)."""
    return f"(CASE WHEN {q}[2] = 1 THEN {q}[1]::text ELSE {q}[1]::text || '/' || {q}[2]::text END)"


def _q_sum(target: str, a: str, b: str, op: str, up: str) -> str:
    """Statements: ``target := dp_q_round(dp_q_add(a, b), up)`` (``op`` ``+``) or ``dp_q_sub`` (``-``): the same
    arithmetic, dp_q_round called only when the reduced denominator exceeds MAX_DENOMINATOR (else it returns its
    argument)."""
    n = f"({a}[1] * {b}[2] {op} {b}[1] * {a}[2])"
    d = f"({a}[2] * {b}[2])"
    return f"""{target} := ARRAY[div({n}, gcd({n}, {d})), div({d}, gcd({n}, {d}))];
  IF {target}[2] > {_M} THEN
    {target} := dp_q_round({target}, {up});
  END IF;"""


#: A number as ``str(Fraction)`` writes it: no leading zeros, no ``-0``, a denominator (if any) > 1. At most
#: MAX_DIGITS characters long, with numerator and denominator coprime, it is a text dp_stored_number accepts, and
#: below MAX_DENOMINATOR and MAX_AMOUNT_NUMERATOR_DIGITS without a sign, one dp_amount accepts. (No bounded
#: repetition: PostgreSQL's regular expressions run those several times slower.)
_CANONICAL_NUMBER = "^(0|-?[1-9][0-9]*)(/([2-9]|[1-9][0-9]+))?$"


def _fraction_of(text: str) -> str:
    """SQL: the fraction numeric[] {numerator, denominator} of ``text``, which matches _CANONICAL_NUMBER."""
    return (f"CASE WHEN strpos({text}, '/') = 0 THEN ARRAY[{text}::numeric, 1] "
            f"ELSE ARRAY[split_part({text}, '/', 1)::numeric, split_part({text}, '/', 2)::numeric] END")


def _stored_number(target: str, text: str, where: str) -> str:
    """Statements: ``target := dp_stored_number(text, where)``; the call (and ``where``) only for a ``text`` that is
    not plainly a number the ledger writes: the call decides, and refuses with its message."""
    return f"""{target} := CASE WHEN length({text}) <= {MAX_DIGITS} AND {text} ~ '{_CANONICAL_NUMBER}'
    THEN {_fraction_of(text)} END;
  IF {target} IS NULL OR gcd({target}[1], {target}[2]) <> 1 THEN
    {target} := dp_stored_number({text}, {where});
  END IF;"""


def _account_number(target: str, column: str) -> str:
    """:func:`_stored_number` of the column ``column`` of the account ``a``."""
    return _stored_number(target, f"a.{column}", f"jsonb_build_object('what', format('budget account %L: {column}', "
                          f"a.name), 'account', a.name, 'column', '{column}')")


def _amount(target: str, text: str, name: str, positive: bool) -> str:
    """Statements: ``target := dp_amount(text, name, positive)``; the call only for a ``text`` that is not plainly
    an amount it accepts: the call decides, and refuses with its message."""
    zero = f" OR {target}[1] = 0" if positive else ""
    return f"""{target} := CASE WHEN length({text}) <= {MAX_AMOUNT_NUMERATOR_DIGITS} AND {text} ~ '{_CANONICAL_NUMBER}'
      AND left({text}, 1) <> '-' THEN {_fraction_of(text)} END;
  IF {target} IS NULL OR {target}[2] > {_M} OR gcd({target}[1], {target}[2]) <> 1{zero} THEN
    {target} := dp_amount({text}, '{name}', {str(positive).lower()});
  END IF;"""


#: The spend key's bounds (dp_spend_key_id), and its id as AuditKey.key_id computes it.
_KEY_BOUNDS = f"""
  IF p_key IS NULL OR octet_length(p_key) < 32 OR octet_length(p_key) > {MAX_KEY_BYTES} THEN
    {_fail(KEY_REFUSED, "'the spend key must have 32 to " + str(MAX_KEY_BYTES) + " bytes; nothing was changed'",
           "jsonb_build_object('kind', 'key_length')")}
  END IF;"""
_KEY_ID = f"left(encode(sha256(decode('{KEY_ID_DOMAIN.hex()}', 'hex') || p_key), 'hex'), 16)"
#: dp_spend_key_id into ``v_key_id``.
_SPEND_KEY_ID = f"""{_KEY_BOUNDS}
  v_key_id := {_KEY_ID};"""

#: dp_check_release_key.
#: A series step's run id (canonical: dp_operators.ledger.store.SERIES_STEP_RUN_ID), a POSIX regular expression
#: capturing the part before the step number; any other run id under the series prefix is refused.
SERIES_STEP_RUN_ID = "^(__dp_series__/g(0|[1-9][0-9]{0,5})/step/)[0-9]{6}$"
#: The run ids whose first attempt may reserve 0: a series' steps after step 0, whose series paid at step 0
#: (dp_operators.continual.run.step_key; ADR 33). Any other release is charged > 0.
ZERO_AMOUNT_RUN_ID = "^__dp_series__/g(0|[1-9][0-9]{0,5})/step/(00000[1-9]|0000[1-9][0-9]|000[1-9][0-9]{2}|00[1-9][0-9]{3}|0[1-9][0-9]{4}|[1-9][0-9]{5})$"
#: The run id prefix of series steps (dp_operators.ledger.store.SERIES_RUN_PREFIX).
SERIES_RUN_PREFIX = "__dp_series__/"


def _series_step_committed(step: str, extra: str = "") -> str:
    """SQL: whether the caller's account holds a committed charge of its series' step ``step`` (an integer
    expression), the release key's other columns equal (``v_series``: the run id before the step number)."""
    return (f"EXISTS (SELECT 1 FROM dp_charges AS x WHERE x.dag_id = p_dag_id AND x.run_id = v_series || "
            f"lpad(({step})::text, 6, '0') AND x.task_id = p_task_id AND x.map_index = p_map_index "
            f"AND x.release_name = p_release_name AND {_OF_ACCOUNT} AND x.state = 'committed'{extra})")


_RELEASE_KEY_CHECK = f"""
  IF p_account IS NULL OR length(p_account) > 200 OR p_dag_id IS NULL OR length(p_dag_id) > 250
      OR p_run_id IS NULL OR length(p_run_id) > 250 OR p_task_id IS NULL OR length(p_task_id) > 250
      OR p_map_index IS NULL OR p_release_name IS NULL OR length(p_release_name) > 200 THEN
    {_fail(BAD_VALUE, "'a release key needs a dag_id, run_id and task_id of at most 250 characters, a map_index, and "
           "a release name and account of at most 200 characters'", "jsonb_build_object('kind', 'release_key')")}
  END IF;"""


_BACKSLASH = "\\"
#: A ``\\u`` escape of a UTF-16 surrogate, as a PostgreSQL regular expression (a backslash, then ``u``).
_SURROGATE_ESCAPE = "\\\\u[dD][89a-fA-F]"
_LONE_SURROGATE = "'%s holds a lone surrogate escape (a \\uD800-\\uDFFF not paired), which is not Unicode text'"


def _check_json(text: str, name: str, max_chars: str, max_depth: str, json_type: str) -> str:
    """Statements of dp_check_json (variables :data:`_CHECK_JSON_VARS`). The query for numbers beyond the readers
    runs only when the text outside strings holds a suspect one (which needs an exponent or 25 characters)."""
    return f"""
  IF {text} IS NULL OR length({text}) > {max_chars} THEN
    {_fail(BAD_VALUE, f"format('%s must be JSON text of at most %s characters', {name}, {max_chars})",
           "jsonb_build_object('kind', 'json')")}
  END IF;
  -- the text outside strings; its brackets, then one level of empty pairs off per pass
  v_bare := regexp_replace({text}, '"(\\\\.|[^"\\\\])*"', '', 'g');
  v_shape := regexp_replace(v_bare, '[^][{{}}]+', '', 'g');
  FOR i IN 1..{max_depth} LOOP
    EXIT WHEN v_shape = '';
    v_shape := regexp_replace(v_shape, '\\[\\]|\\{{\\}}', '', 'g');
  END LOOP;
  IF v_shape <> '' THEN
    {_fail(BAD_VALUE, f"format('%s nests deeper than %s levels (or is not JSON)', {name}, {max_depth})",
           "jsonb_build_object('kind', 'json')")}
  END IF;
  BEGIN
    v_type := json_typeof({text}::json);
  EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
    v_type := NULL;
  END;
  IF v_type IS NULL OR v_type <> coalesce({json_type}, v_type) THEN
    {_fail(BAD_VALUE, f"format('%s must be a JSON %s', {name}, coalesce({json_type}, 'value'))",
           "jsonb_build_object('kind', 'json')")}
  END IF;
  -- a \\u escape of a UTF-16 surrogate (rare): jsonb, which pairs them, decides (the readers refuse a lone one)
  IF strpos({text}, '{_BACKSLASH}u') > 0 AND {text} ~ '{_SURROGATE_ESCAPE}' THEN
    BEGIN
      -- jsonb also refuses a \\u0000 escape, which the readers read: made a space first, which changes no pairing
      -- (in an escaped backslash followed by "u0000" it stays an escaped backslash followed by "u0020")
      PERFORM replace({text}, '{_BACKSLASH}u0000', '{_BACKSLASH}u0020')::jsonb;
    EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
      {_fail(BAD_VALUE, "format(" + _LONE_SURROGATE + ", " + name + ")", "jsonb_build_object('kind', 'json')")}
    END;
  END IF;
  -- one scan for the few numbers that could be beyond the readers, not a loop over every number
  IF (length(v_bare) >= 25 OR strpos(v_bare, 'e') > 0 OR strpos(v_bare, 'E') > 0)
      AND v_bare ~ '{_SUSPECT_NUMBER}' THEN
    SELECT m[1] INTO v_number FROM regexp_matches(v_bare, '{_SUSPECT_NUMBER}', 'g') AS m
      WHERE NOT dp_json_number_ok(m[1]) LIMIT 1;
    IF v_number IS NOT NULL THEN
      {_fail(BAD_VALUE, "format('%s holds the number %s, which the ledger''s readers refuse (finite doubles and "
             "integers of at most " + f"{MAX_JSON_INTEGER_DIGITS:,}" + f" digits only)', {name}, CASE WHEN "
             "length(v_number) <= 40 THEN v_number ELSE format('%s...%s (%s characters)', left(v_number, 20), "
             "right(v_number, 10), length(v_number)) END)", "jsonb_build_object('kind', 'json_number')")}
    END IF;
  END IF;"""


_CHECK_JSON_VARS = """
  v_bare text;
  v_shape text;
  v_type text;
  v_number text;"""


def _context_value_ok(value: str) -> str:
    """SQL: the value ``value`` (jsonb) of an audit context is one dp_context accepts: null, a string of at most
    MAX_CONTEXT_VALUE_CHARS characters or an integer of at most 18 digits."""
    return (f"(jsonb_typeof({value}) = 'null'\n"
            f"        OR (jsonb_typeof({value}) = 'string' AND length({value} #>> '{{}}') <= "
            f"{MAX_CONTEXT_VALUE_CHARS})\n"
            f"        OR (jsonb_typeof({value}) = 'number' AND ({value} #>> '{{}}') ~ '^-?[0-9]{{1,18}}$'))")


def _context_value_json(value: str) -> str:
    """SQL: the value ``value`` (jsonb) of a checked audit context as canonical_json writes it."""
    return (f"CASE jsonb_typeof({value}) WHEN 'string' THEN to_json({value} #>> '{{}}')::text "
            f"WHEN 'number' THEN (({value} #>> '{{}}')::numeric)::text ELSE 'null' END")


#: SQL over the rows ``key``, ``value`` of a checked context: its canonical_json (sorted keys, no whitespace).
_CANONICAL_CONTEXT = (f"'{{' || coalesce(string_agg(to_json(key)::text || ':' || {_context_value_json('value')}, "
                      "',' ORDER BY key COLLATE \"C\"), '') || '}'")


def _spendable(account: str, row: str) -> str:
    """Statements of dp_spendable_account: the account's row into ``row``, without a lock, then the caller's role
    (dp_check_roles returns at once when ``allowed_roles`` is NULL: the query is saved then)."""
    return f"""
  SELECT * INTO {row} FROM dp_budget_accounts AS x WHERE x.name = {account};
  IF NOT FOUND THEN
    {_fail(ACCOUNT_NOT_FOUND, f"format('budget account %L is not in the ledger', {account})",
           f"jsonb_build_object('account', {account})")}
  END IF;
  IF {row}.allowed_roles IS NOT NULL THEN
    PERFORM dp_check_roles({row});
  END IF;"""


def _check_head(a: str, key: str, key_id: str) -> str:
    """Statements of dp_check_head (variables :data:`_CHECK_HEAD_VARS`)."""
    agrees = "{e}.spent_after = {a}.spent AND {e}.delta_spent_after = {a}.delta_spent"
    head, own = agrees.format(e="v_head", a=a), agrees.format(e="v_own", a=a)
    return f"""
  IF coalesce({a}.audit_seq, 0) <> 0 THEN
    SELECT * INTO v_head FROM dp_audit_events AS x WHERE x.account = {a}.name AND x.account_seq = {a}.audit_seq;
    v_intact := FOUND AND coalesce(v_head.row_hash = {a}.audit_head AND {head}, false);
    IF v_intact AND {a}.spend_key_id = {key_id} THEN
      IF v_head.key_id = {key_id} THEN  -- the head is the key's newest event
        v_intact := coalesce(dp_event_mac(v_head, {key}) = v_head.row_hash AND {head}, false);
      ELSE
        SELECT * INTO v_own FROM dp_audit_events AS x WHERE x.account = {a}.name AND x.key_id = {key_id}
          ORDER BY x.account_seq DESC LIMIT 1;
        IF v_own.id IS NOT NULL THEN
          v_intact := coalesce(dp_event_mac(v_own, {key}) = v_own.row_hash AND {own}, false);
        END IF;
      END IF;
    END IF;
    IF NOT v_intact THEN
      {_fail(CHAIN_BROKEN, f"format('budget account %L: its running totals or chain head disagree with the last "
             "event of its audit chain (edited outside the ledger); nothing was changed. A privacy officer runs "
             f"''dpctl ledger verify''', {a}.name)", f"jsonb_build_object('kind', 'head', 'account', {a}.name)")}
    END IF;
  END IF;"""


_CHECK_HEAD_VARS = """
  v_head dp_audit_events;
  v_own dp_audit_events;
  v_intact boolean;"""


def _lock(account: str, key_id: str) -> str:
    """Statements of AccountChain.lock, once the caller's role was checked on the unlocked row (variables
    :data:`_LOCK_VARS`): lock the account row into ``a``, check the role again (allowed_roles may have changed in
    between), read the stored totals (once: ``v_spent``, ``v_delta_spent``) and check the chain head.

    The spend functions queue first on a row no spend changes, the account's first audit event (exclusive: no
    login but the tables' owner may lock a row): the waiters for an account row that each call updates would all
    wake at every commit to find its newer version and queue again, each of them, for every charge; on a row that
    stays where it is they wait in turn, one woken per commit. The account's row lock is then taken at once (or
    after the governor, which locks the row alone), and it is the lock that serialises the account's writes."""
    return f"""
  PERFORM FROM dp_audit_events AS x WHERE x.account = {account} AND x.account_seq = 1 FOR UPDATE;
  SELECT * INTO a FROM dp_budget_accounts AS x WHERE x.name = {account} FOR UPDATE;
  IF NOT FOUND THEN
    {_fail(ACCOUNT_NOT_FOUND, f"format('budget account %L is not in the ledger', {account})",
           f"jsonb_build_object('account', {account})")}
  END IF;
  IF a.allowed_roles IS NOT NULL THEN
    PERFORM dp_check_roles(a);
  END IF;
  {_account_number("v_spent", "spent")}
  {_account_number("v_delta_spent", "delta_spent")}{_check_head("a", "p_key", key_id)}"""


_LOCK_VARS = _CHECK_HEAD_VARS + """
  v_unlocked dp_budget_accounts;
  v_spent numeric[];
  v_delta_spent numeric[];"""


def _key_check(key_id: str) -> str:
    """Statements of dp_check_key: the account ``a`` accepts the spend key ``key_id``."""
    return f"""
  IF a.spend_key_id IS DISTINCT FROM {key_id} THEN
    {_fail(KEY_REFUSED, "format('budget account %L accepts spend key id %L, not %L; nothing was changed', a.name, "
           f"a.spend_key_id, {key_id})", "jsonb_build_object('kind', 'spend_key', 'account', a.name, 'accepts', "
           f"a.spend_key_id, 'given', {key_id})")}
  END IF;"""


def _token_hash(token: str) -> str:
    """SQL: the SHA-256 (hex) of the reservation token ``token``; NULL for one longer than MAX_TOKEN_CHARS (which
    then matches no charge)."""
    return (f"CASE WHEN length({token}) <= {MAX_TOKEN_CHARS} THEN encode(sha256(convert_to({token}, 'UTF8')), "
            "'hex') END")


def _owned_checks(key_id: str) -> str:
    """Statements of Ledger._owned_charge once the account ``a`` is locked and the charge read into ``c``: the
    reservation's account, release key, attempt and token (``v_token_hash``: :func:`_token_hash`), the spend key,
    the state."""
    return f"""
  IF NOT coalesce(c.account = p_account AND c.dag_id = p_dag_id AND c.run_id = p_run_id AND c.task_id = p_task_id
      AND c.map_index = p_map_index AND c.release_name = p_release_name AND c.attempt = p_attempt
      AND c.token_hash = v_token_hash, false) THEN
    {_fail(CHARGE_STATE, "format('charge %s is not this reservation''s (the account, release key, attempt or token "
           "differ); nothing was changed', p_charge_id)", "jsonb_build_object('kind', 'not_owner')")}
  END IF;{_key_check(key_id)}
  IF c.state <> 'reserved' THEN
    {_fail(CHARGE_STATE, "format('charge %s is %s, no longer reserved; nothing was changed, and the charge stays "
           "spent', p_charge_id, c.state)", "jsonb_build_object('kind', 'state', 'state', c.state)")}
  END IF;"""


def _sign(e: str, key_id: str) -> str:
    """Statements of dp_append before its INSERT: the event ``e`` as the next of the chain of the account ``a``,
    signed with ``p_key``."""
    return f"""
  {e}.account := a.name;
  {e}.account_seq := coalesce(a.audit_seq, 0) + 1;
  {e}.spent_after := a.spent;
  {e}.delta_spent_after := a.delta_spent;
  {e}.created_at := coalesce({e}.created_at, {_ts_text("clock_timestamp()")});
  {e}.key_id := {key_id};
  {e}.prev_hash := coalesce(a.audit_head, '{GENESIS_HASH}');
  {e}.row_hash := dp_event_mac({e}, p_key);"""


def _insert_event(e: str) -> str:
    """SQL: INSERT the event ``e``; nothing if another row holds its sequence number."""
    return (f"INSERT INTO dp_audit_events ({', '.join(_EVENT_COLUMNS)})\n"
            f"    VALUES ({', '.join(f'{e}.{name}' for name in _EVENT_COLUMNS)})\n"
            "    ON CONFLICT DO NOTHING")


def _seq_taken(e: str) -> str:
    """Statements: refuse the event ``e`` whose sequence number another row holds (variable ``v_taken``)."""
    return f"""
    SELECT x.id INTO v_taken FROM dp_audit_events AS x WHERE x.account = a.name AND x.account_seq = {e}.account_seq;
    {_fail(CHAIN_BROKEN, "format('budget account %L: audit row id=%s already holds sequence number %s, which the "
           "ledger did not write; nothing was changed. A privacy officer runs ''dpctl ledger verify''', a.name, "
           f"v_taken, {e}.account_seq)", "jsonb_build_object('kind', 'seq_taken', 'account', a.name, 'id', v_taken, "
           f"'seq', {e}.account_seq)")}"""


def _append(e: str, key_id: str) -> str:
    """Statements of dp_append (variable ``v_taken``): ``a`` gets its new head."""
    return f"""{_sign(e, key_id)}
  {_insert_event(e)};
  IF NOT FOUND THEN{_seq_taken(e)}
  END IF;
  a.audit_seq := {e}.account_seq;
  a.audit_head := {e}.row_hash;"""


#: dp_flush: the account ``a``'s running totals and chain head.
_FLUSH = """
  UPDATE dp_budget_accounts AS x SET spent = a.spent, delta_spent = a.delta_spent, audit_seq = a.audit_seq,
    audit_head = a.audit_head, updated_at = clock_timestamp()
  WHERE x.name = a.name;"""


def _append_and_flush(e: str, key_id: str) -> str:
    """Statements of dp_append then dp_flush, the INSERT and the UPDATE one statement: the account's row changes
    only with its event in (and a refused event changes nothing)."""
    return f"""{_sign(e, key_id)}
  a.audit_seq := {e}.account_seq;
  a.audit_head := {e}.row_hash;
  WITH appended AS ({_insert_event(e)} RETURNING 1)
  UPDATE dp_budget_accounts AS x SET spent = a.spent, delta_spent = a.delta_spent, audit_seq = a.audit_seq,
    audit_head = a.audit_head, updated_at = clock_timestamp()
  FROM appended WHERE x.name = a.name;
  IF NOT FOUND THEN{_seq_taken(e)}
  END IF;"""


def _charge_event(e: str, event: str, c: str, context: str, details: str) -> str:
    """Statements of dp_charge_event: ``e`` becomes the event ``event`` of the charge ``c``."""
    fields = ["dag_id", "run_id", "task_id", "map_index", "release_name", "attempt", "try_number", "spec_hash",
              "amount", "delta_amount", "mechanisms"]
    return f"""
  {e} := NULL;
  {e}.event := {event};
  {e}.charge_id := {c}.id;""" + "".join(f"\n  {e}.{name} := {c}.{name};" for name in fields) + f"""
  {e}.context := {context};
  {e}.details := {details};"""


def _lease_check(now: str) -> str:
    """Statements of dp_check_lease at ``now`` (variables :data:`_LEASE_VARS`). The key's charges are read by the
    release-key index whatever plan the plan cache settles on (the account-and-state index would read every
    reservation the account ever had, until vacuum)."""
    return f"""
  SELECT x.attempt, x.lease_expires_at INTO v_held_attempt, v_held_until
    FROM (SELECT * FROM dp_charges AS x WHERE {_KEY_MATCHES} OFFSET 0) AS x
    WHERE {_OF_ACCOUNT} AND x.state = 'reserved' AND {_live(now)}
    ORDER BY x.attempt LIMIT 1;
  IF FOUND THEN
    {_fail(LEASE_HELD, "format('attempt %s of release %L (run %L, task %L) is still running and holds its lease "
           "until %s; nothing was charged', v_held_attempt, p_release_name, p_run_id, p_task_id, "
           "dp_ts_text(v_held_until))",
           "jsonb_build_object('attempt', v_held_attempt, 'expires_at', dp_ts_text(v_held_until))")}
  END IF;"""


_LEASE_VARS = """
  v_held_attempt integer;
  v_held_until timestamp with time zone;"""


HELPERS: tuple[Function, ...] = (
    Function("dp_fail", "p_code text, p_message text, p_detail jsonb", "void", """
BEGIN
  RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message, DETAIL = coalesce(p_detail, '{}'::jsonb)::text;
END
"""),
    # -- exact fractions: numeric[] {numerator, denominator > 0}, in lowest terms ---------------------------------
    Function("dp_q", "p_n numeric, p_d numeric", "numeric[]", """
DECLARE
  v_gcd numeric := gcd(p_n, p_d);
BEGIN
  RETURN ARRAY[div(p_n, v_gcd), div(p_d, v_gcd)];
END
""", volatility="IMMUTABLE STRICT"),
    Function("dp_q_text", "p_q numeric[]", "text", f"""
BEGIN
  RETURN {_q_text("p_q")};
END
""", volatility="IMMUTABLE STRICT"),
    Function("dp_q_add", "p_a numeric[], p_b numeric[]", "numeric[]", """
BEGIN
  RETURN dp_q(p_a[1] * p_b[2] + p_b[1] * p_a[2], p_a[2] * p_b[2]);
END
""", volatility="IMMUTABLE STRICT"),
    Function("dp_q_sub", "p_a numeric[], p_b numeric[]", "numeric[]", """
BEGIN
  RETURN dp_q(p_a[1] * p_b[2] - p_b[1] * p_a[2], p_a[2] * p_b[2]);
END
""", volatility="IMMUTABLE STRICT"),
    Function("dp_q_cmp", "p_a numeric[], p_b numeric[]", "integer", """
BEGIN
  RETURN sign(p_a[1] * p_b[2] - p_b[1] * p_a[2])::integer;
END
""", volatility="IMMUTABLE STRICT"),
    # round_up / round_down of accounting.budget: to a multiple of 1/MAX_DENOMINATOR when the denominator is larger
    Function("dp_q_round", "p_q numeric[], p_up boolean", "numeric[]", f"""
DECLARE
  v_scaled numeric;
  v_quotient numeric;
  v_rest numeric;
BEGIN
  IF p_q[2] <= {_M} THEN
    RETURN p_q;
  END IF;
  v_scaled := p_q[1] * {_M};
  v_quotient := div(v_scaled, p_q[2]);
  v_rest := mod(v_scaled, p_q[2]);
  IF p_up AND v_rest > 0 THEN
    v_quotient := v_quotient + 1;
  ELSIF NOT p_up AND v_rest < 0 THEN
    v_quotient := v_quotient - 1;
  END IF;
  RETURN dp_q(v_quotient, {_M});
END
""", volatility="IMMUTABLE STRICT"),
    # a number as the ledger stores it (bounded.read_number: exactly str(Fraction), at most MAX_DIGITS digits a
    # side): anything else is an edit outside the ledger
    Function("dp_stored_number", "p_text text, p_where jsonb", "numeric[]", f"""
DECLARE
  v_num text;
  v_den text;
  v_q numeric[];
BEGIN
  IF length(p_text) <= {2 * MAX_DIGITS + 2} AND p_text ~ '^-?[0-9]+(/[0-9]+)?$' THEN
    v_num := split_part(p_text, '/', 1);
    v_den := coalesce(nullif(split_part(p_text, '/', 2), ''), '1');
    IF length(ltrim(v_num, '-')) <= {MAX_DIGITS} AND length(v_den) <= {MAX_DIGITS} AND v_den::numeric <> 0 THEN
      v_q := dp_q(v_num::numeric, v_den::numeric);
      IF dp_q_text(v_q) = p_text THEN
        RETURN v_q;
      END IF;
    END IF;
  END IF;
  {_fail(CHAIN_BROKEN, "format('%s is %L, not a number the ledger writes (edited outside the ledger); nothing was "
         "changed. A privacy officer runs ''dpctl ledger verify''', p_where ->> 'what', left(p_text, 40))",
         "p_where || jsonb_build_object('kind', 'number', 'value', left(p_text, 1000))")}
  RETURN NULL;
END
""", volatility="IMMUTABLE"),
    # an amount a caller gives: str(Fraction) of a number >= 0 (> 0 if p_positive), bounded
    Function("dp_amount", "p_text text, p_name text, p_positive boolean", "numeric[]", f"""
DECLARE
  v_num text;
  v_den text;
  v_q numeric[];
BEGIN
  IF p_text IS NULL OR p_text !~ '^[0-9]+(/[0-9]+)?$' THEN
    {_fail(BAD_VALUE, "format('%s must be a number >= 0 written as str(Fraction) (p or p/q), got %L', "
           "p_name, left(p_text, 60))", "jsonb_build_object('kind', 'amount')")}
  END IF;
  v_num := split_part(p_text, '/', 1);
  v_den := coalesce(nullif(split_part(p_text, '/', 2), ''), '1');
  IF length(v_num) > {MAX_AMOUNT_NUMERATOR_DIGITS} OR length(v_den) > 19 OR v_den::numeric = 0
      OR v_den::numeric > {_M} THEN
    {_fail(BAD_VALUE, "format('%s %s is out of bounds: at most " + str(MAX_AMOUNT_NUMERATOR_DIGITS) + " digits "
           "over a denominator in (0, " + _M + "]', p_name, left(p_text, 60))", "jsonb_build_object('kind', 'amount')")}
  END IF;
  v_q := ARRAY[v_num::numeric, v_den::numeric];
  IF gcd(v_q[1], v_q[2]) <> 1 OR {_q_text("v_q")} <> p_text THEN
    {_fail(BAD_VALUE, "format('%s %s is not in lowest terms (write it as str(Fraction))', p_name, p_text)",
           "jsonb_build_object('kind', 'amount')")}
  END IF;
  IF p_positive AND v_q[1] = 0 THEN
    {_fail(BAD_VALUE, "format('a charge must be > 0, got %s', p_text)", "jsonb_build_object('kind', 'amount')")}
  END IF;
  RETURN v_q;
END
""", volatility="IMMUTABLE"),
    # accounting.unit_of (NULL for an accountant it does not know)
    Function("dp_unit", "p_accountant text", "text", f"""
BEGIN
  RETURN CASE p_accountant {_ACCOUNTANT_UNITS} END;
END
""", volatility="IMMUTABLE"),
    Function("dp_ts_text", "p_at timestamp with time zone", "text", f"""
BEGIN
  RETURN {_ts_text("p_at")};
END
""", volatility="IMMUTABLE STRICT"),
    # the spend key's id as AuditKey.key_id computes it, after bounding the key
    Function("dp_spend_key_id", "p_key bytea", "text", f"""
BEGIN{_KEY_BOUNDS}
  RETURN {_KEY_ID};
END
""", volatility="IMMUTABLE"),
    Function("dp_check_release_key", f"p_account text, {_RELEASE_KEY_ARGS}", "void", f"""
BEGIN{_RELEASE_KEY_CHECK}
END
""", volatility="IMMUTABLE"),
    # a JSON number (a whole token of valid JSON) the ledger's readers accept (bounded.read_json): an integer of at
    # most MAX_JSON_INTEGER_DIGITS digits, or a number of magnitude below 2^1024 - 2^970, which Python's float()
    # reads as a finite double (one too small for any double reads as 0.0). Decided on the digits, none converted:
    # 10^v_order <= |value| < 10^(v_order + 1), and at 10^308 the digits are compared with the limit's.
    Function("dp_json_number_ok", "p_token text", "boolean", f"""
DECLARE
  v_parts text[];
  v_int text;
  v_frac text;
  v_digits text;
  v_exponent text;
  v_order numeric;
BEGIN
  v_parts := regexp_match(p_token, '^-?([0-9]+)(?:[.]([0-9]+))?(?:[eE]([-+]?)([0-9]+))?$');
  IF v_parts IS NULL THEN
    RETURN false;
  END IF;
  IF v_parts[2] IS NULL AND v_parts[4] IS NULL THEN
    RETURN length(v_parts[1]) <= {MAX_JSON_INTEGER_DIGITS};
  END IF;
  v_int := ltrim(v_parts[1], '0');
  v_frac := coalesce(v_parts[2], '');
  v_digits := rtrim(ltrim(v_int || v_frac, '0'), '0');
  IF v_digits = '' THEN
    RETURN true;
  END IF;
  v_order := CASE WHEN v_int <> '' THEN length(v_int) - 1 ELSE length(ltrim(v_frac, '0')) - length(v_frac) - 1 END;
  v_exponent := ltrim(coalesce(v_parts[4], ''), '0');
  IF length(v_exponent) > 18 THEN  -- beyond any text's count of digits: the exponent's sign decides
    RETURN v_parts[3] = '-';
  END IF;
  v_order := v_order + CASE WHEN v_parts[3] = '-' THEN -1 ELSE 1 END * coalesce(nullif(v_exponent, ''), '0')::numeric;
  RETURN v_order < 308 OR (v_order = 308 AND v_digits COLLATE "C" < '{_DOUBLE_LIMIT_DIGITS}');
END
""", volatility="IMMUTABLE STRICT"),
    # JSON text a caller gives: at most p_max_chars characters, nested at most p_max_depth levels, of JSON type
    # p_type (any type if NULL), every number one the ledger's readers accept (dp_json_number_ok)
    Function("dp_check_json", "p_text text, p_name text, p_max_chars integer, p_max_depth integer, p_type text",
             "void", f"""
DECLARE{_CHECK_JSON_VARS}
BEGIN{_check_json("p_text", "p_name", "p_max_chars", "p_max_depth", "p_type")}
END
""", volatility="IMMUTABLE"),
    # an audit context (chain.audit_context): an object of AUDIT_CONTEXT_KEYS, values strings, integers or null
    Function("dp_context", "p_text text", "jsonb", f"""
DECLARE
  v_context jsonb;
  v_item record;
  v_key text;
  v_value jsonb;
  v_checked integer := 0;
BEGIN
  IF p_text IS NULL OR octet_length(p_text) > {MAX_CONTEXT_BYTES} THEN
    {_fail(BAD_VALUE, "'an audit context must be a JSON object of at most " + str(MAX_CONTEXT_BYTES) + " bytes'",
           "jsonb_build_object('kind', 'context')")}
  END IF;
  BEGIN
    v_context := p_text::jsonb;
  EXCEPTION WHEN invalid_text_representation OR untranslatable_character OR numeric_value_out_of_range THEN
    v_context := NULL;  -- numeric_value_out_of_range: a number jsonb cannot hold (1e999999)
  END;
  IF v_context IS NULL OR jsonb_typeof(v_context) <> 'object' THEN
    {_fail(BAD_VALUE, "'an audit context must be a JSON object'", "jsonb_build_object('kind', 'context')")}
  END IF;
  -- the keys it may have, one at a time (no query); the loop below, over its items, names the first it refuses
  IF v_context - ARRAY[{_CONTEXT_KEYS}] = '{{}}'::jsonb THEN
    FOREACH v_key IN ARRAY ARRAY[{_CONTEXT_KEYS}] LOOP
      v_value := v_context -> v_key;
      EXIT WHEN NOT (v_value IS NULL OR {_context_value_ok("v_value")});
      v_checked := v_checked + 1;
    END LOOP;
    IF v_checked = {len(AUDIT_CONTEXT_KEYS)} THEN
      RETURN v_context;
    END IF;
  END IF;
  FOR v_item IN SELECT key, value FROM jsonb_each(v_context) LOOP
    IF NOT v_item.key = ANY (ARRAY[{_CONTEXT_KEYS}]) THEN
      {_fail(BAD_VALUE, "format('audit context key %L is not one of [" + _CONTEXT_KEYS.replace("'", "''") + "]', "
             "v_item.key)", "jsonb_build_object('kind', 'context')")}
    END IF;
    IF NOT {_context_value_ok("v_item.value")} THEN
      {_fail(BAD_VALUE, "format('audit context %L must be a string (at most " + str(MAX_CONTEXT_VALUE_CHARS)
             + " characters), an integer or None', v_item.key)", "jsonb_build_object('kind', 'context')")}
    END IF;
  END LOOP;
  RETURN v_context;
END
""", volatility="IMMUTABLE"),
    # canonical_json of a checked context (sorted keys, no whitespace)
    Function("dp_context_text", "p_context jsonb", "text", f"""
DECLARE
  v_key text;
  v_value jsonb;
  v_parts text[] := ARRAY[]::text[];
BEGIN
  IF jsonb_typeof(p_context) = 'object' THEN
    IF p_context - ARRAY[{_CONTEXT_KEYS}] = '{{}}'::jsonb THEN  -- the audit context keys only: in their order
      FOREACH v_key IN ARRAY ARRAY[{_CONTEXT_KEYS}] LOOP
        v_value := p_context -> v_key;
        IF v_value IS NOT NULL THEN
          v_parts := v_parts || (to_json(v_key)::text || ':' || {_context_value_json("v_value")});
        END IF;
      END LOOP;
      RETURN '{{' || array_to_string(v_parts, ',') || '}}';
    END IF;
  END IF;
  RETURN (SELECT {_CANONICAL_CONTEXT}
    FROM jsonb_each(p_context));
END
""", volatility="IMMUTABLE STRICT"),
    # chain.audit_row_mac, in SQL
    Function("dp_event_mac", "e dp_audit_events, p_key bytea", "text", f"""
BEGIN
  RETURN encode(@CRYPTO@.hmac(convert_to({_canonical_event_json()}, 'UTF8'), p_key, 'sha256'::text), 'hex');
END
""", volatility="IMMUTABLE"),
    # the database roles whose members may spend from the account (NULL: any spender)
    Function("dp_check_roles", "a dp_budget_accounts", "void", f"""
DECLARE
  v_roles jsonb;
BEGIN
  IF a.allowed_roles IS NULL THEN
    RETURN;
  END IF;
  BEGIN
    v_roles := a.allowed_roles::jsonb;
  EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
    v_roles := NULL;
  END;
  IF jsonb_typeof(v_roles) = 'array' AND EXISTS (
      SELECT FROM jsonb_array_elements(v_roles) AS r(role)
      JOIN pg_catalog.pg_roles AS pr ON pr.rolname = r.role #>> '{{}}'
      WHERE jsonb_typeof(r.role) = 'string' AND pg_catalog.pg_has_role(session_user, pr.oid, 'MEMBER')) THEN
    RETURN;
  END IF;
  {_fail(ROLE_NOT_ALLOWED, "format('budget account %L may be spent only by members of the database roles %s; "
         "role %L is not a member of any; nothing was changed', a.name, a.allowed_roles, session_user)",
         "jsonb_build_object('account', a.name, 'role', session_user, 'allowed', coalesce(v_roles, "
         "to_jsonb(a.allowed_roles)))")}
END
""", volatility="STABLE"),
    # whether the session may spend from an account (dp_check_roles without the error): reconcile skips the rest
    Function("dp_may_spend", "p_account text", "boolean", """
BEGIN
  PERFORM dp_check_roles(b) FROM dp_budget_accounts AS b WHERE b.name = p_account;
  RETURN true;
EXCEPTION WHEN SQLSTATE '""" + ROLE_NOT_ALLOWED + """' THEN
  RETURN false;
END
""", volatility="STABLE"),
    # chain._check_head: the row must agree with the head of its chain (and with the newest event of its key)
    Function("dp_check_head", "a dp_budget_accounts, p_key bytea, p_key_id text", "void", f"""
DECLARE{_CHECK_HEAD_VARS}
BEGIN{_check_head("a", "p_key", "p_key_id")}
END
""", volatility="STABLE"),
    # the account the caller may spend from, read without a lock: its row, once the caller's role is checked
    # (dp_check_roles), so a login of another team is refused before it takes or waits for any lock of the account
    Function("dp_spendable_account", "p_account text", "dp_budget_accounts", f"""
DECLARE
  a dp_budget_accounts;
BEGIN{_spendable("p_account", "a")}
  RETURN a;
END
""", volatility="STABLE"),
    # AccountChain.lock: check the caller's role, lock the account row, check the role again (allowed_roles may
    # have changed in between), the stored totals and the chain head
    Function("dp_lock_account", "p_account text, p_key bytea, p_key_id text", "dp_budget_accounts", f"""
DECLARE
  a dp_budget_accounts;{_LOCK_VARS}
BEGIN{_spendable("p_account", "v_unlocked")}{_lock("p_account", "p_key_id")}
  RETURN a;
END
"""),
    Function("dp_check_key", "a dp_budget_accounts, p_key_id text", "void", f"""
BEGIN{_key_check("p_key_id")}
END
""", volatility="IMMUTABLE"),
    # AccountChain.append: the next event of the account's chain, signed; returns the account with its new head
    Function("dp_append", "a dp_budget_accounts, e dp_audit_events, p_key bytea, p_key_id text",
             "dp_budget_accounts", f"""
DECLARE
  v_taken bigint;
BEGIN{_append("e", "p_key_id")}
  RETURN a;
END
"""),
    # AccountChain.flush
    Function("dp_flush", "a dp_budget_accounts", "void", f"""
BEGIN{_FLUSH}
END
"""),
    # chain.charge_event_fields
    Function("dp_charge_event", "p_event text, c dp_charges, p_context text, p_details text", "dp_audit_events", f"""
DECLARE
  e dp_audit_events;
BEGIN{_charge_event("e", "p_event", "c", "p_context", "p_details")}
  RETURN e;
END
""", volatility="IMMUTABLE"),
    # spend.abandon: the charge stays spent; the event records why
    Function("dp_abandon_charge",
             "a dp_budget_accounts, c dp_charges, p_key bytea, p_key_id text, p_context text, p_reason text",
             "dp_budget_accounts", """
BEGIN
  UPDATE dp_charges AS x SET state = 'abandoned', updated_at = clock_timestamp() WHERE x.id = c.id;
  RETURN dp_append(a, dp_charge_event('abandoned', c, p_context, '{"reason":' || to_json(p_reason)::text || '}'),
                   p_key, p_key_id);
END
"""),
    Function("dp_charge_account", "p_charge_id bigint", "text", f"""
DECLARE
  v_account text;
BEGIN
  SELECT x.account INTO v_account FROM dp_charges AS x WHERE x.id = p_charge_id;
  IF NOT FOUND THEN
    {_fail(CHARGE_STATE, "format('charge %s does not exist; nothing was changed', p_charge_id)",
           "jsonb_build_object('kind', 'missing')")}
  END IF;
  RETURN v_account;
END
""", volatility="STABLE"),
    # Ledger._owned_charge, once the account is locked: this reservation's charge, still reserved
    Function("dp_owned_charge",
             f"a dp_budget_accounts, p_charge_id bigint, p_account text, {_RELEASE_KEY_ARGS}, p_attempt integer, "
             "p_token text, p_key_id text", "dp_charges", f"""
DECLARE
  c dp_charges;
  v_token_hash text := {_token_hash("p_token")};
BEGIN
  SELECT * INTO c FROM dp_charges AS x WHERE x.id = p_charge_id;{_owned_checks("p_key_id")}
  RETURN c;
END
""", volatility="STABLE"),
    # spend._raise_if_leased: another attempt of the key holds a live lease
    Function("dp_check_lease", f"p_account text, {_RELEASE_KEY_ARGS}, p_now timestamp with time zone", "void", f"""
DECLARE{_LEASE_VARS}
BEGIN{_lease_check("p_now")}
END
""", volatility="STABLE"),
)


_BOUNDING_VARS = """
  v_steps jsonb;
  v_declared jsonb;"""


def _bounding_check(status: str) -> str:
    """Statements of :func:`~dp_operators.ledger.structure.bounding_refusal` (variables :data:`_BOUNDING_VARS`) on
    the locked account ``a`` and ``p_mechanisms`` (checked by :func:`_check_json` to be a JSON array within its
    bounds): on an account whose stored configuration requires enforced contribution bounding, every step must
    record ``contribution_bounding.mode`` ``enforced``, else the function returns ``{status: 'bounding_not_enforced',
    declared: [aggregates]}`` (``[]`` for no step) having written nothing."""
    return f"""
  IF a.config IS NOT NULL AND (a.config::jsonb -> '{structure.REQUIRE_ENFORCED_BOUNDING}') = 'true'::jsonb THEN
    BEGIN
      -- jsonb refuses a \\u0000 escape, which the readers read (as dp_check_json does)
      v_steps := replace(p_mechanisms, '{_BACKSLASH}u0000', '{_BACKSLASH}u0020')::jsonb;
    EXCEPTION WHEN invalid_text_representation OR untranslatable_character OR program_limit_exceeded
                   OR statement_too_complex OR numeric_value_out_of_range THEN
      v_steps := NULL;
    END;
    IF coalesce(jsonb_typeof(v_steps) <> 'array' OR jsonb_array_length(v_steps) = 0, true) THEN
      RETURN jsonb_build_object('{status}', 'bounding_not_enforced', 'declared', '[]'::jsonb);
    END IF;
    SELECT jsonb_agg(DISTINCT left(coalesce(CASE WHEN jsonb_typeof(m -> 'aggregate') = 'string'
                                                 AND m ->> 'aggregate' <> '' THEN m ->> 'aggregate' END, '?'), 200))
      INTO v_declared
      FROM jsonb_array_elements(v_steps) AS m
      WHERE NOT coalesce(jsonb_typeof(m) = 'object'
                         AND (m -> 'contribution_bounding' -> 'mode') = '"enforced"'::jsonb, false);
    IF v_declared IS NOT NULL THEN
      RETURN jsonb_build_object('{status}', 'bounding_not_enforced', 'declared', v_declared);
    END IF;
  END IF;"""


_RESERVE_ARGS = (
    f"{_RELEASE_KEY_ARGS}, p_amount text, p_takeover text, p_delta text, p_mechanisms text, p_spec_hash text, "
    "p_try_number integer, p_context text, p_token_hash text, p_lease_seconds double precision"
)
_RESERVE_PASS = ("p_dag_id, p_run_id, p_task_id, p_map_index, p_release_name, p_amount, p_takeover, p_delta, "
                 "p_mechanisms, p_spec_hash, p_try_number, p_context, p_token_hash, p_lease_seconds")

#: The charge of one account (the spender's dp_reserve decides which accounts a charge touches, then calls this on
#: each; the spender may not call it: a block or a quota is never charged alone).
_RESERVE_MEMBER = Function(
    "dp_reserve_member",
    f"p_key bytea, p_account text, {_RESERVE_ARGS}",
    "jsonb",
    f"""
DECLARE
  v_key_id text;
  v_amount numeric[];
  v_takeover numeric[];
  v_amount_text text;
  v_mine boolean;
  v_series text;
  v_step integer;
  v_delta numeric[];
  v_limit numeric[];
  v_remaining numeric[];
  v_total numeric[];
  v_unit text;
  v_context text;
  v_now timestamp with time zone;
  v_created timestamp with time zone;
  v_lease timestamp with time zone;
  v_output text;
  v_attempt integer;
  v_replay boolean;
  v_reserved boolean;
  v_charge_id bigint;
  v_taken bigint;
  v_refused dp_audit_events;
  v_approval jsonb;
  a dp_budget_accounts;
  c dp_charges;
  e dp_audit_events;{_BOUNDING_VARS}{_CHECK_JSON_VARS}{_LEASE_VARS}{_LOCK_VARS}
BEGIN
{_SPEND_KEY_ID}{_RELEASE_KEY_CHECK}
  {_amount("v_amount", "p_amount", "amount", False)}
  {_amount("v_takeover", "p_takeover", "takeover amount", True)}
  IF v_amount[1] = 0 AND p_run_id !~ '{ZERO_AMOUNT_RUN_ID}' THEN
    {_fail(BAD_VALUE, "format('a charge must be > 0, got 0: only a series step after the first (run id "
           "__dp_series__/g<generation>/step/<t>, t > 0) reserves nothing, its series paid at step 0; run id %L', "
           "left(p_run_id, 60))", "jsonb_build_object('kind', 'amount')")}
  END IF;
  {_amount("v_delta", "p_delta", "delta", False)}{_check_json("p_mechanisms", "'mechanisms'", str(MAX_MECHANISMS_CHARS),
                                                          str(MAX_JSON_DEPTH), "'array'")}
  IF p_spec_hash IS NULL OR length(p_spec_hash) > 64 THEN
    {_fail(BAD_VALUE, "'spec_hash must be text of at most 64 characters'", "jsonb_build_object('kind', 'spec_hash')")}
  END IF;
  IF p_token_hash IS NULL OR length(p_token_hash) <> 64 OR p_token_hash ~ '[^0-9a-f]' THEN
    {_fail(BAD_VALUE, "'token_hash must be the SHA-256 of the reservation token, in 64 lowercase hex digits'",
           "jsonb_build_object('kind', 'token_hash')")}
  END IF;
  IF NOT coalesce(p_lease_seconds > 0 AND p_lease_seconds <= {_MAX_LEASE}, false) THEN
    {_fail(BAD_VALUE, "format('lease_seconds must be in (0, " + str(_MAX_LEASE) + "], got %s', p_lease_seconds)",
           "jsonb_build_object('kind', 'lease')")}
  END IF;
  v_context := dp_context_text(dp_context(p_context) || jsonb_build_object('db_role', session_user));
  -- what every event of this call records from the caller (a refusal's; a reservation's adds the charge)
  v_refused.event := 'refused';
  v_refused.dag_id := p_dag_id;
  v_refused.run_id := p_run_id;
  v_refused.task_id := p_task_id;
  v_refused.map_index := p_map_index;
  v_refused.release_name := p_release_name;
  v_refused.try_number := p_try_number;
  v_refused.spec_hash := p_spec_hash;
  v_refused.amount := p_amount;
  v_refused.delta_amount := p_delta;
  v_refused.mechanisms := p_mechanisms;
  v_refused.context := v_context;
  -- another team's login is refused before it reads the account's charges or waits for its lock
{_spendable("p_account", "v_unlocked")}
  -- before the lock, so tries polling a busy key do not queue on the account ahead of the owner's renewals
  v_now := clock_timestamp();{_lease_check("v_now")}
{_lock("p_account", "v_key_id")}{_key_check("v_key_id")}
  IF v_delta[1] <> 0 AND a.accountant <> 'approx_dp' THEN
    {_fail(BAD_VALUE, "format('account %L is %s: a charge on it has no delta part', a.name, a.accountant)",
           "jsonb_build_object('kind', 'no_delta', 'account', a.name, 'accountant', a.accountant)")}
  END IF;
  IF NOT coalesce(a.allowed_dags::jsonb ? p_dag_id, false) THEN
    v_refused.details := '{{"reason":"dag_not_allowed"}}';{_append_and_flush("v_refused", "v_key_id")}
    RETURN jsonb_build_object('status', 'dag_not_allowed', 'allowed', a.allowed_dags::jsonb);
  END IF;

  -- the key's charges, in one query by the release-key index: the next attempt (numbered across accounts), and on
  -- this account a committed output to replay (the first attempt's), and whether a reservation is left to take over
  SELECT coalesce(max(x.attempt), 0) + 1,
         coalesce(bool_or({_OF_ACCOUNT} AND x.state = 'committed'), false),
         (array_agg(x.output ORDER BY x.attempt) FILTER (WHERE {_OF_ACCOUNT} AND x.state = 'committed'))[1],
         coalesce(bool_or({_OF_ACCOUNT} AND x.state = 'reserved'), false),
         coalesce(bool_or({_OF_ACCOUNT}), false)
    INTO v_attempt, v_replay, v_output, v_reserved, v_mine
    FROM dp_charges AS x WHERE {_KEY_MATCHES};
  IF v_replay THEN
    RETURN jsonb_build_object('status', 'replay', 'output', v_output);
  END IF;
  -- the account's contribution-bounding policy, on the row locked above (a block's or a quota's own record, which
  -- carries its account's): after the replay of a committed output, before anything is written{_bounding_check("status")}
  -- the first charge of a key on this account is the amount; a later one (an earlier attempt may have drawn noise)
  -- the takeover amount, which is > 0 (ADR 33: a series step's first attempt costs nothing more, a redraw does)
  v_amount_text := p_amount;
  IF v_mine THEN
    v_amount := v_takeover;
    v_amount_text := p_takeover;
  END IF;
  -- a series step (ADR 33): steps in order, each after its predecessor's commit on this account; a free one only
  -- in a series whose step 0 paid
  IF starts_with(p_run_id, '{SERIES_RUN_PREFIX}') THEN
    v_series := substring(p_run_id from '{SERIES_STEP_RUN_ID}');
    IF v_series IS NULL THEN
      {_fail(BAD_VALUE, "format('run id %L is under the series prefix but is no series step (__dp_series__/g<generation>/step/<6 digits>)', left(p_run_id, 60))", "jsonb_build_object('kind', 'series')")}
    END IF;
    v_step := right(p_run_id, 6)::integer;
    IF v_step > 0 AND NOT {_series_step_committed("v_step - 1")} THEN
      {_fail(BAD_VALUE, "format('series step %s of %L comes before step %s is committed on account %L: a series releases its steps in order', v_step, v_series, v_step - 1, p_account)", "jsonb_build_object('kind', 'series')")}
    END IF;
    IF v_amount[1] = 0 AND NOT {_series_step_committed("0", " AND x.amount <> '0'")} THEN
      {_fail(BAD_VALUE, "format('series step %s of %L reserves nothing, but its step 0 was not committed with a charge on account %L', v_step, v_series, p_account)", "jsonb_build_object('kind', 'series')")}
    END IF;
  END IF;
  v_refused.amount := v_amount_text;
  v_now := clock_timestamp();
  IF v_reserved THEN
    FOR c IN SELECT * FROM (SELECT * FROM dp_charges AS x WHERE {_KEY_MATCHES} OFFSET 0) AS x
        WHERE {_OF_ACCOUNT} AND x.state = 'reserved' ORDER BY x.attempt LOOP
      IF c.lease_expires_at > v_now AND c.lease_expires_at <= v_now + interval '{_MAX_LEASE} seconds' THEN
        PERFORM dp_check_lease(p_account, p_dag_id, p_run_id, p_task_id, p_map_index, p_release_name, v_now);
      END IF;
      -- a try of this key on another account (a spec that changed account, or another team's DAG id) is not
      -- this call's to take over: it stays reserved, and spent, until its own account's reconcile
      a := dp_abandon_charge(a, c, p_key, v_key_id, v_context,
                             'lease expired; a later attempt of the same release key took over');
    END LOOP;
  END IF;

  {_account_number("v_limit", "cap")}
  {_q_sum("v_remaining", "v_limit", "v_spent", "-", "false")}
  IF v_amount[1] * v_remaining[2] > v_remaining[1] * v_amount[2] THEN
    v_unit := dp_unit(a.accountant);
    IF v_unit IS NULL THEN
      {_fail(BAD_VALUE, "format('unknown accountant %L', a.accountant)", "jsonb_build_object('kind', 'accountant')")}
    END IF;
  ELSIF a.accountant = 'approx_dp' THEN
    {_account_number("v_limit", "delta")}
    {_q_sum("v_remaining", "v_limit", "v_delta_spent", "-", "false")}
    IF v_delta[1] * v_remaining[2] > v_remaining[1] * v_delta[2] THEN
      v_unit := 'delta';
    END IF;
  END IF;
  IF v_unit IS NOT NULL THEN
    IF v_remaining[1] < 0 THEN
      v_remaining := ARRAY[0, 1]::numeric[];
    END IF;
    v_refused.details := '{{"reason":"budget_exhausted","remaining":' || to_json({_q_text("v_remaining")})::text
      || ',"unit":' || to_json(v_unit)::text || '}}';{_append_and_flush("v_refused", "v_key_id")}
    RETURN jsonb_build_object('status', 'budget_exhausted', 'unit', v_unit, 'remaining', {_q_text("v_remaining")},
                              'requested', v_amount_text);
  END IF;

  -- the account's approval policy (dp_operators.ledger.approvals): held back, nothing reserved or refused-logged
  IF a.config IS NOT NULL AND jsonb_typeof(a.config::jsonb -> 'approval') = 'object' THEN
    {_account_number("v_limit", "cap")}
    {_q_sum("v_remaining", "v_limit", "v_spent", "-", "false")}
    v_approval := dp_approval_check(a, p_dag_id, p_run_id, p_task_id, p_map_index, p_release_name, p_spec_hash,
                                    v_amount, v_remaining, p_mechanisms, clock_timestamp());
    IF v_approval IS NOT NULL THEN
      IF v_reserved THEN{_FLUSH}
      END IF;
      RETURN v_approval || jsonb_build_object('requested', v_amount_text, 'remaining',
                                              CASE WHEN v_remaining[1] < 0 THEN '0' ELSE {_q_text("v_remaining")} END);
    END IF;
  END IF;
  v_created := clock_timestamp();
  v_lease := v_now + make_interval(secs => p_lease_seconds);
  INSERT INTO dp_charges (account, dag_id, run_id, task_id, map_index, release_name, attempt, state, amount,
                          delta_amount, mechanisms, spec_hash, try_number, context, token_hash, lease_expires_at,
                          created_at, updated_at)
    VALUES (a.name, p_dag_id, p_run_id, p_task_id, p_map_index, p_release_name, v_attempt, 'reserved', v_amount_text,
            p_delta, p_mechanisms, p_spec_hash, p_try_number, v_context, p_token_hash, v_lease, v_created, v_created)
    RETURNING id INTO v_charge_id;
  {_q_sum("v_total", "v_spent", "v_amount", "+", "true")}
  a.spent := {_q_text("v_total")};
  {_q_sum("v_total", "v_delta_spent", "v_delta", "+", "true")}
  a.delta_spent := {_q_text("v_total")};
  -- the charge's event (dp_charge_event): the caller's fields as the charge stores them, and the charge's own
  e := v_refused;
  e.event := 'reserved';
  e.charge_id := v_charge_id;
  e.attempt := v_attempt;
  e.token_hash := p_token_hash;
  e.created_at := {_ts_text("v_created")};{_append_and_flush("e", "v_key_id")}
  RETURN jsonb_build_object('status', 'reserved', 'charge_id', v_charge_id, 'attempt', v_attempt,
                            'lease_expires_at', {_ts_text("v_lease")}, 'amount', v_amount_text);
END
""",
)

_WINDOW_PATTERNS = " ".join(
    f"WHEN '{name}' THEN '^{pattern.pattern}$'" for name, pattern in sorted(structure.WINDOW_PATTERNS.items())
)
_MEMBER_RETRY = "DPL99"  # raised inside dp_reserve to undo its members' reservations; never leaves it

_RESERVE = Function(
    "dp_reserve",
    f"p_key bytea, p_account text, p_windows text[], {_RESERVE_ARGS}",
    "jsonb",
    f"""
DECLARE
  v_config jsonb;
  v_members text[];
  v_member text;
  v_window text;
  v_pattern text;
  v_team text;
  v_result jsonb;
  v_parts jsonb := '[]';
  v_stopped text;
  v_stopped_at text;
  v_row dp_budget_accounts;
BEGIN
  -- which accounts the charge touches (dp_operators.ledger.structure.members_charged), from the account's stored
  -- configuration, which only the governor writes
  IF cardinality(p_windows) > {structure.MAX_WINDOWS} THEN
    {_fail(BAD_VALUE, "format('a release reads at most {structure.MAX_WINDOWS} windows; this one names %s', cardinality(p_windows))", "jsonb_build_object('kind', 'windows')")}
  END IF;
  SELECT x.config::jsonb INTO v_config FROM dp_budget_accounts AS x WHERE x.name = p_account;
  IF jsonb_typeof(v_config -> 'part_of') = 'object' THEN
    {_fail(BAD_VALUE, "format('account %L is a member of account %L (a block or a team quota): a release names %L and the ledger charges its members', p_account, v_config -> 'part_of' ->> 'account', v_config -> 'part_of' ->> 'account')", "jsonb_build_object('kind', 'member')")}
  END IF;
  IF jsonb_typeof(v_config -> 'blocks') = 'object' THEN
    IF coalesce(cardinality(p_windows), 0) = 0 THEN
      {_fail(BAD_VALUE, "format('account %L has privacy blocks (%s windows): a release on it names the windows of data it reads (from its run''s data interval or partition key)', p_account, v_config -> 'blocks' ->> 'window')", "jsonb_build_object('kind', 'windows')")}
    END IF;
    v_pattern := CASE v_config -> 'blocks' ->> 'window' {_WINDOW_PATTERNS} END;
    FOREACH v_window IN ARRAY p_windows LOOP
      IF v_window IS NULL OR v_pattern IS NULL OR v_window !~ v_pattern THEN
        {_fail(BAD_VALUE, "format('window %L is not a %s window of account %L', left(v_window, 70), v_config -> 'blocks' ->> 'window', p_account)", "jsonb_build_object('kind', 'windows')")}
      END IF;
    END LOOP;
    v_members := ARRAY(SELECT DISTINCT p_account || '{structure.MEMBER_SEPARATOR}' || w FROM unnest(p_windows) AS w ORDER BY 1);
  ELSE
    IF coalesce(cardinality(p_windows), 0) > 0 THEN
      {_fail(BAD_VALUE, "format('account %L has no privacy blocks: a release on it names no windows', p_account)", "jsonb_build_object('kind', 'windows')")}
    END IF;
    IF jsonb_typeof(v_config -> 'quotas') = 'object' THEN
      SELECT min(t.key) INTO v_team FROM jsonb_each(v_config -> 'quotas') AS t
        WHERE jsonb_typeof(t.value -> 'dags') = 'array' AND (t.value -> 'dags') ? p_dag_id;
    END IF;
    IF v_team IS NULL THEN
      -- a plain account, or a DAG no team lists (the account's allowlist, which lists the same DAGs, refuses it)
      RETURN dp_reserve_member(p_key, p_account, {_RESERVE_PASS});
    END IF;
    v_members := ARRAY(SELECT m FROM unnest(ARRAY[p_account, p_account || '{structure.MEMBER_SEPARATOR}{structure.QUOTA_PREFIX}' || v_team]) AS m ORDER BY 1);
  END IF;
  FOREACH v_member IN ARRAY v_members LOOP
    SELECT * INTO v_row FROM dp_budget_accounts AS x WHERE x.name = v_member;
    IF NOT FOUND THEN
      {_fail(ACCOUNT_NOT_FOUND, "format('account %L has no member %L', p_account, v_member)", "jsonb_build_object('account', v_member, 'parent', p_account)")}
    END IF;
    -- every member's team roles before any lock: a login refused on one member reads and holds nothing of another
    IF v_row.allowed_roles IS NOT NULL THEN
      PERFORM dp_check_roles(v_row);
    END IF;
  END LOOP;
  -- all or nothing: a member that does not reserve undoes the others (the block is a subtransaction)
  BEGIN
    FOREACH v_member IN ARRAY v_members LOOP
      v_result := dp_reserve_member(p_key, v_member, {_RESERVE_PASS});
      IF v_result ->> 'status' <> 'reserved' THEN
        v_stopped := v_result::text;
        v_stopped_at := v_member;
        RAISE EXCEPTION USING ERRCODE = '{_MEMBER_RETRY}';
      END IF;
      v_parts := v_parts || jsonb_build_array(v_result || jsonb_build_object('account', v_member));
    END LOOP;
  EXCEPTION WHEN SQLSTATE '{_MEMBER_RETRY}' THEN
    v_result := v_stopped::jsonb;
    IF v_result ->> 'status' = 'replay' THEN
      RETURN v_result;
    END IF;
    -- the member's bounding policy (its locked row's), which writes nothing: nothing to record
    IF v_result ->> 'status' = 'bounding_not_enforced' THEN
      RETURN v_result || jsonb_build_object('account', v_stopped_at);
    END IF;
    -- a refusal, recorded on its member alone: the members are as they were before this call, so it refuses again
    v_result := dp_reserve_member(p_key, v_stopped_at, {_RESERVE_PASS});
    IF v_result ->> 'status' = 'reserved' THEN
      RAISE EXCEPTION 'a member account changed while it was charged; retried' USING ERRCODE = '40001';
    END IF;
    RETURN v_result || jsonb_build_object('account', v_stopped_at);
  END;
  RETURN jsonb_build_object('status', 'reserved', 'members', v_parts);
END
""",
    definer=True,
)


_CONTEXTS_GIVEN = """
  v_base := dp_context(p_defaults);
  v_over := dp_context(p_audit);"""


def _context_of_charge(c: str) -> str:
    """SQL: the event's context: the defaults of the caller's process, the stored context of the charge ``c``, the
    caller's ``audit`` (chain.audit_context(audit, stored)), and the caller's database role."""
    return (f"dp_context_text(v_base || CASE WHEN coalesce({c}.context, '') = '' THEN '{{}}'::jsonb\n"
            f"    ELSE dp_context({c}.context) END || v_over || jsonb_build_object('db_role', session_user))")


#: Before the lock: the event's context from the charge as read without it (its context is a fixed column). A
#: context it would refuse is left to the same step under the lock, which refuses it where it always did.
_EARLY_CONTEXT = f"""
  BEGIN
    v_early_context := {_context_of_charge("v_charge")};
  EXCEPTION WHEN OTHERS THEN
    v_early_context := NULL;
  END;"""

_CONTEXT_OF_CHARGE = f"""
  IF v_early_context IS NOT NULL AND c.context IS NOT DISTINCT FROM v_charge.context THEN
    v_context := v_early_context;
  ELSE
    v_context := {_context_of_charge("c")};
  END IF;"""


def _owner_function(name: str, extra_args: str, declare: str, before: str, after: str, early: str = "") -> Function:
    """A function acting on a reservation its caller owns: ``before`` (checks of the arguments), then read the
    charge's account and check the caller's role there (without a lock), ``early`` (work that needs no lock), then
    lock the account and check the charge is the caller's (``Ledger._owned_charge``), then ``after`` (with ``a``,
    ``c``, ``v_key_id``, ``v_spent``, ``v_delta_spent``, and ``v_context`` if the function takes ``p_defaults`` and
    ``p_audit``)."""
    audited = "p_defaults" in extra_args
    return Function(
        name,
        _OWNER_ARGS + extra_args,
        "jsonb",
        f"""
DECLARE
  v_key_id text;
  v_token_hash text;
  v_context text;
  v_early_context text;
  v_base jsonb;
  v_over jsonb;
  v_taken bigint;
  v_charge dp_charges;
  a dp_budget_accounts;
  c dp_charges;
  e dp_audit_events;{_LOCK_VARS}{declare}
BEGIN
{_SPEND_KEY_ID}{_RELEASE_KEY_CHECK}{_CONTEXTS_GIVEN if audited else ""}{before}
  SELECT * INTO v_charge FROM dp_charges AS x WHERE x.id = p_charge_id;
  IF NOT FOUND THEN
    {_fail(CHARGE_STATE, "format('charge %s does not exist; nothing was changed', p_charge_id)",
           "jsonb_build_object('kind', 'missing')")}
  END IF;{_spendable("v_charge.account", "v_unlocked")}
  v_token_hash := {_token_hash("p_token")};{_EARLY_CONTEXT if audited else ""}{early}
{_lock("v_charge.account", "v_key_id")}
  SELECT * INTO c FROM dp_charges AS x WHERE x.id = p_charge_id;{_owned_checks("v_key_id")}
{_CONTEXT_OF_CHARGE if audited else ""}{after}END
""",
        definer=True,
    )


_AUDITED = ", p_defaults text, p_audit text"

#: The other charges of charge ``c``'s reservation: the same release key and token (one per member account).
_SIBLINGS = (
    "x.dag_id = c.dag_id AND x.run_id = c.run_id AND x.task_id = c.task_id AND x.map_index = c.map_index "
    "AND x.release_name = c.release_name AND x.token_hash = c.token_hash AND x.id <> c.id"
)
_SIBLINGS_COMMIT = f"""
  -- a reservation on several member accounts (blocks, quotas) settles whole: its other charges must be still
  -- reserved (committed in this same statement) or committed with this output
  IF EXISTS (SELECT FROM dp_charges AS x WHERE {_SIBLINGS}
             AND NOT (x.state = 'reserved' OR (x.state = 'committed' AND x.output_digest = v_digest))) THEN
    {_fail(CHARGE_STATE, "format('charge %s is one member of a reservation whose other members were settled otherwise: a reservation on several accounts is committed whole, with one output', c.id)", "jsonb_build_object('kind', 'siblings', 'state', 'settled')")}
  END IF;"""
_SIBLINGS_RELEASE = f"""
  -- a reservation on several member accounts is released whole: none of its other charges may be committed or
  -- abandoned (noise may have been drawn for them)
  IF EXISTS (SELECT FROM dp_charges AS x WHERE {_SIBLINGS} AND x.state NOT IN ('reserved', 'released')) THEN
    {_fail(CHARGE_STATE, "format('charge %s is one member of a reservation another member of which was committed or abandoned: its noise may have been drawn, so no member gets its budget back', c.id)", "jsonb_build_object('kind', 'siblings', 'state', 'settled')")}
  END IF;"""

_COMMIT = _owner_function("dp_commit", ", p_output text" + _AUDITED, _CHECK_JSON_VARS + """
  v_digest text;""", _check_json("p_output", "'output'", str(MAX_OUTPUT_CHARS), str(READER_JSON_DEPTH), "NULL"),
    f"""{_SIBLINGS_COMMIT}
  UPDATE dp_charges AS x SET state = 'committed', output = p_output, output_digest = v_digest,
    updated_at = clock_timestamp() WHERE x.id = c.id;{_charge_event("e", "'committed'", "c", "v_context", "NULL")}
  e.output_digest := v_digest;
  e.proof := p_token;{_append_and_flush("e", "v_key_id")}
  RETURN jsonb_build_object('status', 'committed', 'output_digest', v_digest);
""", early="""
  v_digest := encode(sha256(convert_to(p_output, 'UTF8')), 'hex');""")

_NO_NOISE = """'{"reason":"no noise was drawn"}'"""

_RELEASE = _owner_function("dp_release", _AUDITED, "", "", f"""{_SIBLINGS_RELEASE}
  UPDATE dp_charges AS x SET state = 'released', updated_at = clock_timestamp() WHERE x.id = c.id;
  -- rounded up to the ledger's resolution as every total is (accounting.round_up): exact differences would grow
  -- the denominator release after release past what a stored number holds
  a.spent := dp_q_text(dp_q_round(dp_q_sub(v_spent,
    dp_stored_number(c.amount, jsonb_build_object('what', format('charge %s: amount', c.id), 'charge', c.id,
                                                  'column', 'amount'))), true));
  a.delta_spent := dp_q_text(dp_q_round(dp_q_sub(v_delta_spent,
    dp_stored_number(c.delta_amount, jsonb_build_object('what', format('charge %s: delta_amount', c.id),
                                                        'charge', c.id, 'column', 'delta_amount'))), true));
{_charge_event("e", "'released'", "c", "v_context", _NO_NOISE)}
  e.proof := p_token;{_append_and_flush("e", "v_key_id")}
  RETURN jsonb_build_object('status', 'released');
""")

_ABANDON = _owner_function("dp_abandon", _AUDITED, "", "", f"""
  a := dp_abandon_charge(a, c, p_key, v_key_id, v_context, 'its attempt failed after noise may have been drawn');
{_FLUSH}
  RETURN jsonb_build_object('status', 'abandoned');
""")

_MAX_HOLD = schema.MAX_RESERVATION_HOLD_SECONDS
#: dp_renew's refusal once a reservation is older than MAX_RESERVATION_HOLD_SECONDS (Ledger.renew says the same).
_HELD_TOO_LONG = (
    "format('charge %s has held its release key since %s, longer than the ledger allows (" + str(_MAX_HOLD)
    + " s): its lease is not renewed, and another attempt may take the release over once it runs out', c.id, "
    "dp_ts_text(c.created_at))"
)

_RENEW = _owner_function("dp_renew", ", p_lease_seconds double precision", """
  v_end timestamp with time zone;""", f"""
  IF NOT coalesce(p_lease_seconds > 0 AND p_lease_seconds <= {_MAX_LEASE}, false) THEN
    {_fail(BAD_VALUE, "format('lease_seconds must be in (0, " + str(_MAX_LEASE) + "], got %s', p_lease_seconds)",
           "jsonb_build_object('kind', 'lease')")}
  END IF;""", f"""
  IF c.created_at < clock_timestamp() - interval '{_MAX_HOLD} seconds' THEN
    {_fail(CHARGE_STATE, _HELD_TOO_LONG, "jsonb_build_object('kind', 'held')")}
  END IF;
  v_end := clock_timestamp() + make_interval(secs => p_lease_seconds);
  UPDATE dp_charges AS x SET lease_expires_at = v_end WHERE x.id = c.id;
  RETURN jsonb_build_object('status', 'renewed', 'lease_expires_at', dp_ts_text(v_end));
""")

_RECONCILE = Function(
    "dp_reconcile",
    "p_key bytea, p_context text",
    "jsonb",
    f"""
DECLARE
  v_key_id text;
  v_context text;
  v_now timestamp with time zone;
  v_expired record;
  v_id bigint;
  v_dirty boolean;
  v_done jsonb := '[]'::jsonb;
  a dp_budget_accounts;
  c dp_charges;
BEGIN
  v_key_id := dp_spend_key_id(p_key);
  v_context := dp_context_text(dp_context(p_context) || jsonb_build_object('db_role', session_user));
  v_now := clock_timestamp();
  FOR v_expired IN
    SELECT x.account, array_agg(x.id ORDER BY x.id) AS ids FROM dp_charges AS x
    WHERE x.state = 'reserved' AND (x.lease_expires_at IS NULL OR x.lease_expires_at <= v_now
                                    OR x.lease_expires_at > v_now + interval '{_MAX_LEASE} seconds')
      AND dp_may_spend(x.account)  -- another team's expired reservations are its own reconcile's (or the governor's)
    GROUP BY x.account ORDER BY x.account COLLATE "C"
  LOOP
    a := dp_lock_account(v_expired.account, p_key, v_key_id);
    IF a.spend_key_id IS DISTINCT FROM v_key_id THEN
      {_fail(KEY_REFUSED, "format('budget account %L accepts spend key id %L, not %L; nothing was reconciled', "
             "a.name, a.spend_key_id, v_key_id)", "jsonb_build_object('kind', 'reconcile', 'account', a.name, "
             "'accepts', a.spend_key_id, 'given', v_key_id)")}
    END IF;
    v_dirty := false;
    FOREACH v_id IN ARRAY v_expired.ids LOOP
      SELECT * INTO c FROM dp_charges AS x WHERE x.id = v_id;
      CONTINUE WHEN c.state <> 'reserved'
        OR (c.lease_expires_at > v_now AND c.lease_expires_at <= v_now + interval '{_MAX_LEASE} seconds');
      a := dp_abandon_charge(a, c, p_key, v_key_id, v_context, 'lease expired (reconcile)');
      v_dirty := true;
      v_done := v_done || jsonb_build_array(jsonb_build_object(
        'id', c.id, 'account', c.account, 'dag_id', c.dag_id, 'run_id', c.run_id, 'task_id', c.task_id,
        'map_index', c.map_index, 'release_name', c.release_name, 'attempt', c.attempt, 'amount', c.amount,
        'delta_amount', c.delta_amount, 'lease_expires_at', dp_ts_text(c.lease_expires_at)));
    END LOOP;
    IF v_dirty THEN
      PERFORM dp_flush(a);
    END IF;
  END LOOP;
  RETURN v_done;
END
""",
    definer=True,
)

# -- approval before a large charge (dp_operators.ledger.approvals; docs/ledger.md) -----------------------------
_APPROVAL_KEY = (
    "x.account = v_where AND x.dag_id = p_dag_id AND x.run_id = p_run_id AND x.task_id = p_task_id "
    "AND x.map_index = p_map_index AND x.release_name = p_release_name AND x.spec_hash = p_spec_hash"
)
#: An amount in an approval event, when it is one the ledger writes (else it covers nothing).
_EVENT_AMOUNT = (f"CASE WHEN length(e.amount) <= {MAX_DIGITS} AND e.amount ~ '{_CANONICAL_NUMBER}' "
                 f"AND left(e.amount, 1) <> '-' THEN {_fraction_of('e.amount')} END")
_COVERS = "(v_q IS NOT NULL AND v_q[1] * p_amount[2] >= p_amount[1] * v_q[2])"

APPROVAL_HELPERS: tuple[Function, ...] = (
    # approvals.timeout_of: the policy's timeout_hours (default 24) as an interval
    Function("dp_approval_timeout", "a dp_budget_accounts", "interval", """
DECLARE
  v_q numeric[];
BEGIN
  v_q := dp_stored_number(coalesce(a.config::jsonb -> 'approval' ->> 'timeout_hours', '24'),
    jsonb_build_object('what', format('budget account %L: approval timeout_hours', a.name), 'account', a.name,
                       'column', 'config'));
  RETURN make_interval(secs => (v_q[1] * 3600 / v_q[2])::double precision);
END
"""),
    # approvals.mechanism_kinds
    Function("dp_mechanism_kinds", "p_mechanisms text", "text[]", """
BEGIN
  RETURN ARRAY(SELECT k FROM (SELECT coalesce(CASE WHEN jsonb_typeof(m) = 'object' THEN m ->> 'mechanism' END, '')
                                AS k FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_mechanisms::jsonb) = 'array'
                                     THEN p_mechanisms::jsonb ELSE '[]'::jsonb END) AS m) AS x
               ORDER BY k COLLATE "C");
END
""", volatility="IMMUTABLE"),
    # approvals.approval_state: the approval events of the release key and spec hash on the account a
    Function("dp_approval_state",
             f"a dp_budget_accounts, {_RELEASE_KEY_ARGS}, p_spec_hash text, p_amount numeric[], "
             "p_now timestamp with time zone", "jsonb", f"""
DECLARE
  e dp_audit_events;
  v_q numeric[];
  v_granted dp_audit_events;
  v_rejected dp_audit_events;
  v_request dp_audit_events;
  v_first dp_audit_events;
  v_requested timestamp with time zone;
  v_expires timestamp with time zone;
  v_where text;
  v_window text;
BEGIN
  -- approvals.approval_account: a privacy block's approvals are on its account's chain
  v_where := a.name;
  IF jsonb_typeof(a.config::jsonb -> 'part_of') = 'object' AND (a.config::jsonb -> 'part_of') ? 'block' THEN
    v_where := a.config::jsonb -> 'part_of' ->> 'account';
    v_window := a.config::jsonb -> 'part_of' ->> 'block';
  END IF;
  FOR e IN SELECT * FROM dp_audit_events AS x WHERE {_APPROVAL_KEY}
      AND x.event IN ('approval_requested', 'approval_granted', 'approval_rejected') ORDER BY x.account_seq LOOP
    v_q := {_EVENT_AMOUNT};
    IF e.event = 'approval_granted' THEN
      IF v_granted.id IS NULL AND e.key_id IS NOT NULL AND e.key_id IS DISTINCT FROM a.spend_key_id AND {_COVERS}
         -- a block's charge: the request the officer granted lists its window (approvals._plans_window)
         AND (v_window IS NULL OR EXISTS (
           SELECT FROM dp_audit_events AS r WHERE r.account = v_where AND r.event = 'approval_requested'
             AND r.account_seq = CASE WHEN (e.details::jsonb ->> 'request') ~ '^[0-9]{{1,9}}$'
                                      THEN (e.details::jsonb ->> 'request')::integer END
             AND jsonb_typeof(r.details::jsonb -> 'plan' -> 'blocks') = 'array'
             AND EXISTS (SELECT FROM jsonb_array_elements(r.details::jsonb -> 'plan' -> 'blocks') AS b
                         WHERE jsonb_typeof(b) = 'object' AND b ->> 'window' = v_window))) THEN
        v_granted := e;
      END IF;
    ELSIF e.event = 'approval_rejected' THEN
      IF v_rejected.id IS NULL AND e.key_id IS DISTINCT FROM a.spend_key_id THEN
        v_rejected := e;
      END IF;
    ELSE
      IF v_first.id IS NULL THEN
        v_first := e;
      END IF;
      IF {_COVERS} THEN
        v_request := e;
      END IF;
    END IF;
  END LOOP;
  IF v_granted.id IS NOT NULL THEN
    RETURN jsonb_build_object('state', 'granted', 'request', v_granted.details::jsonb -> 'request',
                              'decision', v_granted.account_seq, 'account', v_where);
  END IF;
  IF v_rejected.id IS NOT NULL THEN
    RETURN jsonb_build_object('state', 'rejected', 'reason', 'rejected',
                              'request', v_rejected.details::jsonb -> 'request',
                              'note', v_rejected.details::jsonb -> 'reason', 'account', v_where);
  END IF;
  -- the key's first request timed out undecided: final, whatever amount a later request names
  IF v_first.id IS NOT NULL AND p_now >= v_first.created_at::timestamp with time zone + dp_approval_timeout(a) THEN
    v_request := v_first;
  END IF;
  IF v_request.id IS NULL THEN
    RETURN jsonb_build_object('state', 'none', 'account', v_where);
  END IF;
  v_requested := v_request.created_at::timestamp with time zone;
  v_expires := v_requested + dp_approval_timeout(a);
  RETURN jsonb_build_object('state', CASE WHEN p_now >= v_expires THEN 'rejected' ELSE 'pending' END,
                            'request', v_request.account_seq, 'requested_at', dp_ts_text(v_requested),
                            'expires_at', dp_ts_text(v_expires), 'account', v_where)
    || CASE WHEN p_now >= v_expires THEN jsonb_build_object('reason', 'timeout', 'note', NULL) ELSE '{{}}' END;
END
"""),
    # approvals.check_charge: NULL when the account's policy lets the charge through (not needed, or granted),
    # else dp_reserve's status approval_required / approval_rejected
    Function("dp_approval_check",
             f"a dp_budget_accounts, {_RELEASE_KEY_ARGS}, p_spec_hash text, p_amount numeric[], "
             "p_remaining numeric[], p_mechanisms text, p_now timestamp with time zone", "jsonb", f"""
DECLARE
  v_policy jsonb;
  v_reasons jsonb := '[]'::jsonb;
  v_q numeric[];
  v_last text;
  v_state jsonb;
BEGIN
  v_policy := a.config::jsonb -> 'approval';
  IF jsonb_typeof(v_policy) IS DISTINCT FROM 'object' THEN
    RETURN NULL;
  END IF;
  IF v_policy ->> 'above' IS NOT NULL THEN
    v_q := dp_stored_number(v_policy ->> 'above', jsonb_build_object('what', format('budget account %L: approval '
      'above', a.name), 'account', a.name, 'column', 'config'));
    IF p_amount[1] * v_q[2] > v_q[1] * p_amount[2] THEN
      v_reasons := v_reasons || '["above"]'::jsonb;
    END IF;
  END IF;
  IF v_policy ->> 'above_fraction_of_remaining' IS NOT NULL THEN
    v_q := dp_stored_number(v_policy ->> 'above_fraction_of_remaining', jsonb_build_object('what',
      format('budget account %L: approval above_fraction_of_remaining', a.name), 'account', a.name,
      'column', 'config'));
    IF p_amount[1] * v_q[2] * p_remaining[2] > v_q[1] * greatest(p_remaining[1], 0) * p_amount[2] THEN
      v_reasons := v_reasons || '["above_fraction_of_remaining"]'::jsonb;
    END IF;
  END IF;
  IF jsonb_typeof(v_policy -> 'on_mechanism_change') = 'boolean' AND (v_policy ->> 'on_mechanism_change')::boolean THEN
    -- a privacy block's: the last release on any block of its account (approvals.last_committed_kinds)
    SELECT x.mechanisms INTO v_last FROM dp_charges AS x
      WHERE (x.account = a.name OR (jsonb_typeof(a.config::jsonb -> 'part_of') = 'object'
                                    AND (a.config::jsonb -> 'part_of') ? 'block'
                                    AND starts_with(x.account, (a.config::jsonb -> 'part_of' ->> 'account') || '@')))
        AND x.dag_id = p_dag_id AND x.task_id = p_task_id AND x.map_index = p_map_index
        AND x.release_name = p_release_name AND x.state = 'committed'
      ORDER BY x.id DESC LIMIT 1;
    IF FOUND AND dp_mechanism_kinds(p_mechanisms) IS DISTINCT FROM dp_mechanism_kinds(v_last) THEN
      v_reasons := v_reasons || '["mechanism_change"]'::jsonb;
    END IF;
  END IF;
  IF jsonb_array_length(v_reasons) = 0 THEN
    RETURN NULL;
  END IF;
  v_state := dp_approval_state(a, p_dag_id, p_run_id, p_task_id, p_map_index, p_release_name, p_spec_hash,
                               p_amount, p_now);
  IF v_state ->> 'state' = 'granted' THEN
    -- a grant approves one charge: an attempt after one that reserved under it (and may have drawn) needs another
    IF NOT EXISTS (SELECT FROM dp_charges AS x WHERE x.account = a.name AND x.dag_id = p_dag_id
                   AND x.run_id = p_run_id AND x.task_id = p_task_id AND x.map_index = p_map_index
                   AND x.release_name = p_release_name AND x.state <> 'released') THEN
      RETURN NULL;
    END IF;
    v_state := v_state || jsonb_build_object('state', 'rejected', 'reason', 'grant_used');
  END IF;
  RETURN jsonb_build_object('status', CASE WHEN v_state ->> 'state' = 'rejected' THEN 'approval_rejected'
                                      ELSE 'approval_required' END, 'reasons', v_reasons, 'approval', v_state);
END
"""),
)
HELPERS = HELPERS + APPROVAL_HELPERS

#: The spender's request for an officer's approval (Ledger.request_approval): an ``approval_requested`` event with
#: the plan, or the request already filed for the key and spec hash, or its decision. It writes no decision: only
#: the governor role (which may insert audit events) does, signed with the governor key.
_REQUEST_APPROVAL = Function(
    "dp_request_approval",
    f"p_key bytea, p_account text, {_RELEASE_KEY_ARGS}, p_amount text, p_delta text, p_mechanisms text, "
    "p_spec_hash text, p_plan text, p_context text",
    "jsonb",
    f"""
DECLARE
  v_key_id text;
  v_amount numeric[];
  v_delta numeric[];
  v_context text;
  v_state jsonb;
  v_taken bigint;
  v_team text;
  v_quota text;
  a dp_budget_accounts;
  e dp_audit_events;{_BOUNDING_VARS}{_CHECK_JSON_VARS}{_LOCK_VARS}
BEGIN
{_SPEND_KEY_ID}{_RELEASE_KEY_CHECK}
  {_amount("v_amount", "p_amount", "amount", True)}
  {_amount("v_delta", "p_delta", "delta", False)}{_check_json("p_mechanisms", "'mechanisms'", str(MAX_MECHANISMS_CHARS),
                                                          str(MAX_JSON_DEPTH), "'array'")}{_check_json("p_plan", "'plan'", str(MAX_MECHANISMS_CHARS), str(MAX_JSON_DEPTH), "'object'")}
  IF p_spec_hash IS NULL OR length(p_spec_hash) > 64 THEN
    {_fail(BAD_VALUE, "'spec_hash must be text of at most 64 characters'", "jsonb_build_object('kind', 'spec_hash')")}
  END IF;
  v_context := dp_context_text(dp_context(p_context) || jsonb_build_object('db_role', session_user));
{_spendable("p_account", "v_unlocked")}
  -- requests are filed on the account a release names, by a login that may charge it: not on a block or a quota
  -- (their approvals are the account's), and on an account with quotas only by a member of the DAG's team role
  IF jsonb_typeof(v_unlocked.config::jsonb -> 'part_of') = 'object' THEN
    {_fail(BAD_VALUE, "format('account %L is a member of account %L: approvals are requested on the account a release names', p_account, v_unlocked.config::jsonb -> 'part_of' ->> 'account')", "jsonb_build_object('kind', 'member')")}
  END IF;
  IF NOT coalesce(v_unlocked.allowed_dags::jsonb ? p_dag_id, false) THEN
    RETURN jsonb_build_object('state', 'dag_not_allowed', 'allowed', v_unlocked.allowed_dags::jsonb);
  END IF;
  IF jsonb_typeof(v_unlocked.config::jsonb -> 'quotas') = 'object' THEN
    v_team := (SELECT min(t.key) FROM jsonb_each(v_unlocked.config::jsonb -> 'quotas') AS t
               WHERE jsonb_typeof(t.value -> 'dags') = 'array' AND (t.value -> 'dags') ? p_dag_id);
    IF v_team IS NOT NULL THEN
      v_quota := p_account || '{structure.MEMBER_SEPARATOR}{structure.QUOTA_PREFIX}' || v_team;
{_spendable("v_quota", "v_unlocked")}
    END IF;
  END IF;
{_lock("p_account", "v_key_id")}{_key_check("v_key_id")}
  IF NOT coalesce(a.allowed_dags::jsonb ? p_dag_id, false) THEN
    RETURN jsonb_build_object('state', 'dag_not_allowed', 'allowed', a.allowed_dags::jsonb);
  END IF;
  IF a.config IS NULL OR jsonb_typeof(a.config::jsonb -> 'approval') IS DISTINCT FROM 'object' THEN
    RETURN jsonb_build_object('state', 'no_policy');
  END IF;
  -- an officer never reviews a charge the account's bounding policy would refuse{_bounding_check("state")}
  v_state := dp_approval_state(a, p_dag_id, p_run_id, p_task_id, p_map_index, p_release_name, p_spec_hash,
                               v_amount, clock_timestamp());
  IF v_state ->> 'state' <> 'none' THEN
    RETURN v_state;
  END IF;
  e.event := 'approval_requested';
  e.dag_id := p_dag_id;
  e.run_id := p_run_id;
  e.task_id := p_task_id;
  e.map_index := p_map_index;
  e.release_name := p_release_name;
  e.spec_hash := p_spec_hash;
  e.amount := p_amount;
  e.delta_amount := p_delta;
  e.mechanisms := p_mechanisms;
  e.context := v_context;
  e.details := '{{"plan":' || p_plan || '}}';{_append_and_flush("e", "v_key_id")}
  RETURN jsonb_build_object('state', 'pending', 'request', e.account_seq, 'requested_at', e.created_at,
                            'expires_at', dp_ts_text(e.created_at::timestamp with time zone + dp_approval_timeout(a)));
END
""",
    definer=True,
)

#: The functions the spender executes (one per spend call of :class:`~dp_operators.ledger.spend.Ledger`).
SPEND_FUNCTIONS: tuple[Function, ...] = (_RESERVE, _COMMIT, _RELEASE, _ABANDON, _RENEW, _RECONCILE,
                                         _REQUEST_APPROVAL)

#: Every function of the ledger's (helpers first: a SQL function's body is checked when it is created).
FUNCTIONS: tuple[Function, ...] = HELPERS + (_RESERVE_MEMBER,) + SPEND_FUNCTIONS

#: Install pgcrypto once per database: where it already is, else in ``public`` if the caller may create there (so
#: it outlives any one ledger schema), else in the ledger's schema.
_ENSURE_PGCRYPTO = """
DO $do$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pgcrypto') THEN
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'public')
        AND pg_catalog.has_schema_privilege('public', 'CREATE') THEN
      CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA public;
    ELSE
      CREATE EXTENSION IF NOT EXISTS pgcrypto;
    END IF;
  END IF;
END $do$
"""

#: Revoke the helpers from every role but their owner (grants survive ``CREATE OR REPLACE``; none is ever due).
_REVOKE_HELPERS = (
    "DO $do$ DECLARE r record; BEGIN FOR r IN SELECT p.oid::regprocedure AS fn, a.grantee "
    "FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a WHERE p.oid = ANY (ARRAY["
    + ", ".join(f"'{function.signature}'::regprocedure" for function in HELPERS)
    + "]) AND a.grantee NOT IN (0, p.proowner) LOOP "
    "EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %I', r.fn, pg_catalog.pg_get_userbyid(r.grantee)); "
    "END LOOP; END $do$"
)

_SCHEMAS = """
SELECT format('%I', current_schema()),
       (SELECT format('%I', n.nspname) FROM pg_catalog.pg_extension AS e
        JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace WHERE e.extname = 'pgcrypto')
"""


def _sql(conn, statement: str):
    return conn.exec_driver_sql(statement.replace("%", "%%"))  # the driver's paramstyle escapes %


#: The trigger functions :func:`~dp_operators.ledger.schema.trigger_ddl` (re)creates (no arguments, returning
#: ``trigger``): their names are the ledger's too.
TRIGGER_FUNCTIONS: tuple[str, ...] = tuple(schema._PG_FUNCTIONS)

#: Every function name the ledger defines in its schema, and each name's one definition: name, signature, argument
#: names, return type.
_DEFINITIONS = [(f.name, f.signature, f.arg_names, f.returns) for f in FUNCTIONS] + [
    (name, f"{name}()", (), "trigger") for name in TRIGGER_FUNCTIONS
]
MANAGED_NAMES: tuple[str, ...] = tuple(name for name, *_ in _DEFINITIONS)


def _text_array(items) -> str:
    return "ARRAY[" + ", ".join(f"'{item}'" for item in items) + "]::text[]"


#: Whether the function ``p`` (pg_proc, in the namespace ``n``) is the current definition of its name: the same
#: argument types, argument names and return type (``CREATE OR REPLACE`` can change none of these, so a function of
#: an earlier version that differs stays beside the current one unless dropped).
_IS_CURRENT = (
    "EXISTS (SELECT FROM (VALUES "
    + ", ".join(f"('{name}', '{signature}', {_text_array(names)}, '{returns}')"
                for name, signature, names, returns in _DEFINITIONS)
    + ") AS f(name, signature, argnames, returns) WHERE f.name = p.proname "
    "AND p.oid = pg_catalog.to_regprocedure(format('%I.%s', n.nspname, f.signature)) "
    "AND coalesce(p.proargnames, '{}'::text[]) = f.argnames AND p.prorettype = pg_catalog.to_regtype(f.returns))"
)

#: Drop every function of the current schema named as one of the ledger's that is not its current definition: an
#: overload of an earlier version (or added by hand) would stay callable beside it.
_DROP_STRAYS = (
    "DO $do$ DECLARE r record; BEGIN FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_catalog.pg_proc AS p "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = current_schema() "
    f"AND p.proname = ANY ({_text_array(MANAGED_NAMES)}) AND NOT {_IS_CURRENT} "
    "LOOP EXECUTE format('DROP ROUTINE %s', r.fn); END LOOP; END $do$"
)


def install(conn) -> None:
    """Install pgcrypto (if missing), drop every function of the connection's current schema that has the name of a
    ledger function (the trigger functions' included) but not its current arguments or return type (an overload
    left by an earlier version: ``CREATE OR REPLACE`` cannot change them), then (re)create every ledger function in
    that schema, owned by the connecting role (the tables' owner), pinned to that schema; revoke them from PUBLIC
    and the helpers from every other role. Idempotent: the grants of the spend functions made by
    :func:`~dp_operators.ledger.roles.apply_roles` survive (``CREATE OR REPLACE`` keeps them). Runs in the caller's
    transaction, before :func:`~dp_operators.ledger.schema.trigger_ddl`.

    Raises:
        sqlalchemy.exc.DBAPIError: no schema on the ``search_path``, the role may not create the extension or
            the functions, or does not own a function to drop (or something depends on it).
    """
    _sql(conn, _ENSURE_PGCRYPTO)
    ledger_schema, crypto_schema = _sql(conn, _SCHEMAS).one()
    if ledger_schema is None:
        raise ValueError("no schema on the search_path: set the search_path of the ledger's connection")
    _sql(conn, _DROP_STRAYS)
    for function in FUNCTIONS:
        for statement in function.ddl(ledger_schema, crypto_schema):
            _sql(conn, statement)
    _sql(conn, _REVOKE_HELPERS)


_FUNCTION_QUERY = f"""
SELECT p.proname, p.prosrc, p.prosecdef, p.proconfig, format('search_path=%I, pg_temp', n.nspname),
       p.proowner = t.relowner, pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE'),
       format('%s(%s)', p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid)),
       pg_catalog.pg_get_function_result(p.oid),
       ARRAY(SELECT DISTINCT pg_catalog.pg_get_userbyid(a.grantee) FROM pg_catalog.aclexplode(p.proacl) AS a
             WHERE a.grantee NOT IN (0, p.proowner) ORDER BY 1),
       {_IS_CURRENT}
FROM pg_catalog.pg_class AS t
JOIN pg_catalog.pg_namespace AS n ON n.oid = t.relnamespace
JOIN pg_catalog.pg_proc AS p ON p.pronamespace = n.oid
WHERE t.oid = 'dp_charges'::regclass AND p.proname = ANY ({_text_array(MANAGED_NAMES)})
ORDER BY 8
"""


def function_problems(conn) -> list[str]:
    """Compare the ledger's functions in the database with their definitions: each must exist in the tables'
    schema, owned by the tables' owner, with its expected body, ``SECURITY DEFINER`` exactly for the spend
    functions, its ``search_path`` pinned to that schema then ``pg_temp``, no EXECUTE for PUBLIC, and (the helpers)
    none for any other role; and no other function of that schema may have the name of a ledger function (a trigger
    function's included) with other arguments or return type (an overload left by an earlier version, or added
    outside ``dpctl ledger init``, which drops it). One line per problem (PostgreSQL only)."""
    found: dict[str, tuple] = {}
    problems = []
    for row in _sql(conn, _FUNCTION_QUERY):
        if row[-1]:
            found[row[0]] = tuple(row)
        else:
            problems.append(
                f"ledger function name {row[0]} has an overload that is not the ledger's: {row[7]} returning "
                f"{row[8]} (left by an earlier version or added outside 'dpctl ledger init'; init drops it)"
            )
    crypto = _sql(conn, _SCHEMAS).one()[1]
    if crypto is None:
        problems.insert(0, "the pgcrypto extension is not installed (run 'dpctl ledger init')")
    for function in FUNCTIONS:
        what = f"ledger function {function.signature}"
        if function.name not in found:
            problems.append(f"{what} is missing (run 'dpctl ledger init')")
            continue
        _, source, definer, config, pinned, owned, public, _, _, grantees, _ = found[function.name]
        if crypto is not None and " ".join(source.split()) != " ".join(function.source(crypto).split()):
            problems.append(f"{what} was replaced (its body differs)")
        if definer != function.definer:
            problems.append(f"{what} is {'not ' if function.definer else ''}SECURITY DEFINER (replaced)")
        if list(config or []) != [pinned]:
            problems.append(f"{what} does not pin its search_path to its schema, then pg_temp (replaced)")
        if not owned:
            problems.append(f"{what} is not owned by the ledger tables' owner")
        if public:
            problems.append(f"{what} may be executed by PUBLIC (run 'dpctl ledger init')")
        if grantees and function not in SPEND_FUNCTIONS:
            problems.append(
                f"{what} may be executed by {', '.join(grantees)}: only the spend functions are granted "
                "('dpctl ledger roles' grants them; revoke the rest)"
            )
    return problems


def reserve_enforces_bounding(conn) -> bool:
    """Whether the installed spend functions of the ledger's schema refuse charges whose contribution bounds were
    only declared on an account with ``require_enforced_bounding``: ``dp_reserve_member`` decides it on the account
    row it locked (installed by ``dpctl ledger init`` from this version on; the version before decided it in
    ``dp_reserve`` on a row it had not locked, so a reservation waiting on the governor's ``apply`` could pass) and
    ``dp_request_approval`` refuses such a request. ``dpctl ledger apply`` refuses to set the requirement on a ledger
    whose functions predate it, which would record the policy and not enforce it (or not in every case)."""
    rows = _sql(conn, (
        "SELECT p.proname, p.prosrc FROM pg_catalog.pg_class AS t JOIN pg_catalog.pg_proc AS p "
        "ON p.pronamespace = t.relnamespace WHERE t.oid = 'dp_charges'::regclass "
        "AND p.proname IN ('dp_reserve_member', 'dp_request_approval')"
    )).all()
    sources = {name: source for name, source in rows}
    marker = f"'{structure.REQUIRE_ENFORCED_BOUNDING}'"
    return len(rows) == 2 and all(marker in (sources.get(name) or "")
                                  for name in ("dp_reserve_member", "dp_request_approval"))
