"""claim-gateway: a long-polling claim gateway over a Postgres task table."""

__version__ = "0.1.0"
