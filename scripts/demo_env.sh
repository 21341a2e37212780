# The demo's environment (sourced by scripts/demo.sh; source it yourself to run Airflow or dpctl by hand against
# the demo's Airflow home and ledger, e.g. to replay a release:
#   source scripts/demo_env.sh && airflow tasks test adult_census_release release '<run id>'
# ). The release DAGs need the keys scripts/demo.sh makes in .demo/keys; adult_anonymity_check needs none:
#   source scripts/demo_env.sh && airflow db migrate && airflow dags test adult_anonymity_check
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
  # the series key seals a series' noise (docs/continual.md); the workers hold it with the spend key
  SERIES_EXTRA=""
  if [ -s "$KEYS/series.key" ]; then
    SERIES_EXTRA=", \"series_key\": \"$(head -n 1 "$KEYS/series.key")\""
  fi
  export AIRFLOW_CONN_DP_LEDGER_DEFAULT="{\"conn_type\": \"dp_ledger\", \"extra\": {\"url\": \"$DP_LEDGER_URL\", \"audit_key\": \"$DP_LEDGER_AUDIT_KEY\"$SERIES_EXTRA}}"
fi
# The Adult table: the copy `make demo` fetched (.data/adult.csv), else the team's shared copy beside the repository
# (../shared/data/adult.csv), as the example DAGs look for it; with neither, the path `make demo` fetches to.
if [ -f "$ROOT/.data/adult.csv" ] || [ ! -f "$ROOT/../shared/data/adult.csv" ]; then
  export DP_OPERATORS_ADULT_CSV="$ROOT/.data/adult.csv"
else
  DP_OPERATORS_ADULT_CSV="$(cd "$ROOT/../shared/data" && pwd)/adult.csv"
  export DP_OPERATORS_ADULT_CSV
fi
# Releases (adult_census_release and friends); anonymised microdata and its reports (adult_anonymity_check) go to
# their own folder, beside it: `dpctl release show/verify .demo/releases` reads every JSON file there as a release.
export DP_OPERATORS_OUTPUT_URI="file://$DEMO/releases"
export DP_OPERATORS_OUTPUT_DIR="$DEMO/anonymity"
