"""What the control plane, the executor and the CLI share, with no Django and no torch: the job
spec and its schema, dataset formats and their validation, outcomes and exit codes, the artifact
bundle format and its verification, Celery queue and task names."""
