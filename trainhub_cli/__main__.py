"""``python -m trainhub_cli``: the same as the ``trainhub`` console script."""

from trainhub_cli.main import app

app(prog_name="trainhub")
