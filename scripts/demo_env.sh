# The demo's environment (sourced by scripts/demo.sh; source it yourself to run Airflow or dpctl by hand against
# the demo's Airflow home and ledger, e.g. to replay a release:
#   source scripts/demo_env.sh && airflow tasks test adult_census_release release '<run id>'
# ). Needs the keys scripts/demo.sh makes in .demo/keys.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.venv/bin"
DEMO="$ROOT/.demo"
KEYS="$DEMO/keys"
export PATH="$BIN:$PATH"
export AIRFLOW_HOME="$DEMO/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export DP_LEDGER_URL="sqlite:///$DEMO/ledger.db"
if [ -s "$KEYS/governor.key" ] && [ -s "$KEYS/spend.key" ]; then
  DP_LEDGER_GOVERNOR_KEY="$(head -n 1 "$KEYS/governor.key")"
  DP_LEDGER_AUDIT_KEY="$(head -n 1 "$KEYS/spend.key")"
  export DP_LEDGER_GOVERNOR_KEY DP_LEDGER_AUDIT_KEY
  export AIRFLOW_CONN_DP_LEDGER_DEFAULT="{\"conn_type\": \"dp_ledger\", \"extra\": {\"url\": \"$DP_LEDGER_URL\", \"audit_key\": \"$DP_LEDGER_AUDIT_KEY\"}}"
fi
export DP_OPERATORS_ADULT_CSV="$ROOT/.data/adult.csv"
export DP_OPERATORS_OUTPUT_URI="file://$DEMO/releases"
