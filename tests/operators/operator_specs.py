"""Small release specs the operator tests share (import as ``from operator_specs import ...``)."""

from __future__ import annotations


def selected_count_spec(release: str, account: str, aggregate: str, column: str) -> str:
    """A spec counting by ``column`` with keys chosen by partition selection (discrete Laplace, epsilon 1 and
    delta 1e-6 to select, epsilon 1 to count): the keys published are the data's, not a public list."""
    return f"""\
version: 1
release: {release}
budget_account: {account}
privacy_unit: person
aggregates:
  - name: {aggregate}
    kind: count
    group_by: [{column}]
    partition_selection:
      mechanism: discrete_laplace
      budget: {{epsilon: 1, delta: 1e-6}}
    mechanism: discrete_laplace
    budget: {{epsilon: 1}}
"""


#: What :func:`city_count_spec` releases, as an upstream task returns it.
CITY_COUNTS = {"people": [{"city": "a", "count": 10}, {"city": "b", "count": 20}]}


def city_count_spec(release: str, account: str) -> str:
    """A spec counting ``people`` by ``city`` over the public keys a and b (discrete Laplace, epsilon 0.1)."""
    return f"""\
version: 1
release: {release}
budget_account: {account}
privacy_unit: person
aggregates:
  - name: people
    kind: count
    group_by: [city]
    keys:
      city: [a, b]
    mechanism: discrete_laplace
    budget: {{epsilon: 0.1}}
"""
