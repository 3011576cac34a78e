"""OpenAI's fine-tuning API at OpenAI's paths (served under /v1/ and /api/v1/)."""

from django.urls import path

from api import export_views, inference_views, openai_views, presenters, views
from api.routes import route

urlpatterns = [
    *route("files", views.FileListView.as_view()),
    *route("files/<str:file_id>", views.FileDetailView.as_view()),
    *route("files/<str:file_id>/content", openai_views.FileContentView.as_view()),
    *route("fine_tuning/jobs", views.JobListView.as_view()),
    *route("fine_tuning/jobs/<str:job_id>", views.JobDetailView.as_view()),
    *route("fine_tuning/jobs/<str:job_id>/cancel", views.JobCancelView.as_view()),
    *route("fine_tuning/jobs/<str:job_id>/pause", views.JobPauseView.as_view()),
    *route("fine_tuning/jobs/<str:job_id>/resume", views.JobResumeView.as_view()),
    *route(
        "fine_tuning/jobs/<str:job_id>/events",
        views.JobEventListView.as_view(present=presenters.openai_event_json),
    ),
    *route(
        "fine_tuning/jobs/<str:job_id>/checkpoints",
        openai_views.JobCheckpointListView.as_view(),
    ),
    # trainhub's own, beside OpenAI's
    *route("fine_tuning/jobs/<str:job_id>/retry", views.JobRetryView.as_view()),
    *route("fine_tuning/jobs/<str:job_id>/artifacts", views.JobArtifactListView.as_view()),
    *route("fine_tuning/jobs/<str:job_id>/deploy", inference_views.JobDeployView.as_view()),
    *route("fine_tuning/jobs/<str:job_id>/exports", export_views.JobExportListView.as_view()),
    *route("models", inference_views.ModelListView.as_view()),
    *route("chat/completions", inference_views.ChatCompletionsView.as_view()),
    *route("completions", inference_views.CompletionsView.as_view()),
    # A model's id holds '/' and ':' (ft:owner/name:…): the rest of the path is the id.
    path("models/<path:model>", inference_views.ModelDetailView.as_view()),
]
