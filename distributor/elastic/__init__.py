"""Elastic jobs: workers that fail are replaced while the job runs, and the survivors and the
replacements meet in a new rendezvous round with a fresh world (ranks, size, store).

`world.py` is what a worker learns in each round (both sides use it), `policy.py` the failure
policy a driver enforces. The driver side (rendezvous rounds, the elastic job) imports torch's
c10d store and is loaded only by elastic jobs.
"""
