"""``python -m rftflow`` — and ``accelerate launch … -m rftflow run …`` for a trainer in several
processes — is the ``rftflow`` command."""

from rftflow.flows.cli import main

main()
