"""trainhub GPU executor: runs one training attempt from a job spec (Django-free)."""
