#!/usr/bin/env bash
# make demo: run the example DAG once with `airflow dags test` against a throwaway Airflow home (SQLite) and a
# SQLite ledger under .demo/, then print where the release went, its values and the budget left.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BIN="$ROOT/.venv/bin"
DEMO="$ROOT/.demo"
mkdir -p "$DEMO"

# The two audit keys (docs/ledger.md), made once: the governor key stays with the privacy officer (here: this
# shell's dpctl); the spend key goes in the workers' ledger connection (extra audit_key) and to 'dpctl ledger apply'.
KEYS="$DEMO/keys"
mkdir -p "$KEYS"
chmod 700 "$KEYS"
for role in governor spend; do
  if [ ! -s "$KEYS/$role.key" ]; then
    (umask 077 && "$BIN/dpctl" ledger keygen > "$KEYS/$role.key" 2> /dev/null)
    echo "made the $role key: $KEYS/$role.key"
  fi
  chmod 600 "$KEYS/$role.key"
done
# the series key (64 hex digits) seals the noise of a series (dags/nycflights_series_release.py; docs/continual.md)
if [ ! -s "$KEYS/series.key" ]; then
  (umask 077 && "$BIN/python" -c "from dp_operators.continual.state import SeriesKey; print(SeriesKey.generate().text)" \
    > "$KEYS/series.key")
  echo "made the series key: $KEYS/series.key"
fi
chmod 600 "$KEYS/series.key"
# Airflow home, ledger URL, keys, the ledger connection, data and output locations
source "$ROOT/scripts/demo_env.sh"

# fetch (and verify) Adult into .data unless demo_env.sh found the team's shared copy, which is never written to
if [ "$DP_OPERATORS_ADULT_CSV" = "$ROOT/.data/adult.csv" ]; then
  "$BIN/python" scripts/fetch_adult.py --out "$DP_OPERATORS_ADULT_CSV"
fi
if [ ! -f "$AIRFLOW_HOME/airflow.db" ]; then
  echo "initialising a throwaway Airflow home in $AIRFLOW_HOME (SQLite)"
  "$BIN/airflow" db migrate > "$DEMO/airflow-init.log" 2>&1 || { cat "$DEMO/airflow-init.log"; exit 1; }
fi
"$BIN/dpctl" ledger init
"$BIN/dpctl" ledger apply config/ledgers.yaml

echo "running the example DAG: airflow dags test adult_census_release (log: $DEMO/last-run.log)"
status=0
# the task gets the spend key from its connection; the governor key stays out of Airflow's environment
env -u DP_LEDGER_GOVERNOR_KEY "$BIN/airflow" dags test adult_census_release > "$DEMO/last-run.log" 2>&1 || status=$?
if grep -q "state=success, run_type" "$DEMO/last-run.log"; then
  echo
  "$BIN/dpctl" release show "$DEMO/releases"
else
  echo
  echo "The release task failed; nothing was published for this run. The reason, from the task log:"
  reason=$(grep -E "^[a-zA-Z_.]*(AirflowFailException|Error): " "$DEMO/last-run.log" | tail -1)
  echo "  ${reason:-see $DEMO/last-run.log}"
  status=1
fi
echo
"$BIN/dpctl" ledger show
echo
"$BIN/dpctl" ledger verify || status=1
if [ "$status" -eq 0 ]; then
  echo "Run 'make demo' again to release again (a new run, fresh noise); 'make demo-reset' starts over."
  echo "A series, one step per day of 2013 (dags/nycflights_series_release.py; a backfill: see its docstring):" \
    "source scripts/demo_env.sh && airflow dags test nycflights_series_release 2013-01-02 (releases 1 January; then 2013-01-03, ...)"
  echo "Each day on its own privacy block (dags/nycflights_daily_blocks.py; docs/ledger.md, Privacy blocks):" \
    "source scripts/demo_env.sh && airflow dags test nycflights_daily_blocks 2013-01-02 (charges block nyc_flights_daily@2013-01-01)"
  echo "The aircraft as privacy unit, its flights bounded by the operator itself (dags/nycflights_aircraft_release.py):" \
    "source scripts/demo_env.sh && airflow dags test nycflights_aircraft_release (enforced bounds; account nyc_aircraft)"
else
  echo "'make demo-reset' starts over with a fresh budget."
fi
exit $status
