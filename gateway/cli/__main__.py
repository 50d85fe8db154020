"""`python -m gateway.cli`: the `gateway` command, as the installed script runs it."""

from .main import main

main()
