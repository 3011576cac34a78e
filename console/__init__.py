"""The operator's console: the Django admin (jobs, fleet, projects, webhooks, audit) and its
dashboard. Registers the ``jobs`` app's models; holds no models of its own."""
