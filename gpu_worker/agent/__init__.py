"""The GPU node agent around the executor: the node's settings and GPU probe (``node``), its
HTTPS calls to the control plane (``node_api``), the models it holds (``model_cache``) and the
supervisor that claims an attempt and runs one executor per attempt (``supervisor``). The
node's Celery app, which the Procfile's ``gpu`` process names, is ``gpu_worker.celery_app``."""
