"""What is sent once a transaction commits: Celery messages, the live stream, the webhook outbox."""
