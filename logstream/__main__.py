"""`python -m logstream`: the same as the `logstream` command."""

from logstream.cli import main

main()
