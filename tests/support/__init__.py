"""What the suite shares, in one place: helpers (``api``, ``cloud``, ``db``, ``fleet``,
``webhooks``, ``processes``, ``broker_watch``), factories, fakes of provider APIs and of the
instance metadata service (``fakes/``), and the control plane's fixtures (``fixtures``, loaded
for every test by the root conftest)."""
