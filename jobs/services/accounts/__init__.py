"""Who may do what: projects, API keys, provider credentials and the targets they open, audit."""
