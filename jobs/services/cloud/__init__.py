"""Rented GPUs: offers, launch, the SSH drive, polling, reconcile, provider webhooks."""
