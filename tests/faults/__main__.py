"""`python -m tests.faults`: the whole fault matrix, its table on stdout."""

from tests.faults.matrix import main

raise SystemExit(main())
