"""``dpctl``: the command line for privacy officers and pipeline owners (``dpctl --help``).

The commands live beside this file: :mod:`.ledger`, :mod:`.spec`, :mod:`.release`; what they share (exit codes,
options, where the ledger is and its keys) in :mod:`.common`, whose docstring lists the exit codes.
"""

from dp_operators.cli import ledger, release, spec  # noqa: F401  (registers the commands)
from dp_operators.cli.common import EXIT_INCONSISTENT, app

__all__ = ["EXIT_INCONSISTENT", "app"]
