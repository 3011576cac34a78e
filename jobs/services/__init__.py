"""All writes, as keyword-only functions named ``<entity>_<action>``; views, tasks and the admin
call these. One sub-package per layer, bottom to top (a layer imports only the layers below it;
``make lint`` checks it with import-linter, see pyproject.toml):

- ``outbox``: what is sent once a transaction commits (Celery messages, the live stream, the
  webhook outbox).
- ``accounts``: projects, API keys, provider credentials and the targets they open, the audit trail.
- ``fleet``: the operator's GPU nodes (identity, heartbeats, drain, status); an ending attempt
  frees its node, so the fleet sits below the job's lifecycle.
- ``core``: a job and its attempts (create, status, events, costs, files, artifacts, stop),
  with the port of the places an attempt runs in (``core.runner``: core asks a runner, never
  which kind of place a target is).
- ``cloud``: rented GPUs (offers, launch, the SSH drive, polling, reconcile, provider webhooks).
- ``outbound``: webhook endpoints and deliveries, e-mail notifications.
- ``runners``: one runner per kind of place (own GPU nodes, a serverless queue, an SSH-driven
  machine): start, observe, stop and release an attempt there; registered with the port when
  the jobs app is ready.
- ``scheduling``: where a queued job goes next (placement) and the node dispatcher.
"""
