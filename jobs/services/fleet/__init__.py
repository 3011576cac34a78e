"""The operator's GPU nodes: tokens, registration, heartbeats, drain and status."""
