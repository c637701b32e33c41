"""Deprecated: the in-doubt tool of the jdbc connector, now ``epochal in-doubt`` for every
transactional sink (it works through the sink contract; see ``epochal in-doubt --help``).

::

    python -m epochal_jdbc.indoubt list   --dsn URL --job NAME --snapshot-dir DIR [--sink-id ID]
    python -m epochal_jdbc.indoubt settle --dsn URL --job NAME --snapshot-dir DIR [--sink-id ID]

still work for a release: they run ``epochal in-doubt list|settle NAME --connector jdbc
-o url=URL ...``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (of ``epochal in-doubt``)."""
    from epochal.indoubt import main as in_doubt

    warnings.warn(
        "epochal_jdbc.indoubt is deprecated; use `epochal in-doubt list|settle JOB`",
        DeprecationWarning,
        stacklevel=2,
    )
    with warnings.catch_warnings():  # one warning is enough
        warnings.simplefilter("ignore", DeprecationWarning)
        return in_doubt(["jdbc", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
