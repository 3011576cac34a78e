"""A job and its attempts: create, status, events, costs, files, artifacts, stop."""
