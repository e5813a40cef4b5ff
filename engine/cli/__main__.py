"""`python -m engine.cli`: the `railyard` command, for an environment whose scripts folder is not on PATH."""

from engine.cli import main

main()
