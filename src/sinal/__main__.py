"""`python -m sinal` runs the CLI."""

from sinal.cli import main

main()
