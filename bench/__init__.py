"""The benchmark harness behind `make bench`: runs real gateway processes against real
Postgres and Redis, drives them over HTTP from this process, and reports throughput,
latency and how many claims reached Postgres. See bench/README.md.
"""
