from django.urls import path

from jobs.api import node_views, provider_views, views, webhook_views

urlpatterns = [
    path("files/", views.FileListView.as_view()),
    path("files/<str:file_id>/", views.FileDetailView.as_view()),
    path("jobs/", views.JobListView.as_view()),
    path("jobs/<str:job_id>/", views.JobDetailView.as_view()),
    path("jobs/<str:job_id>/cancel/", views.JobCancelView.as_view()),
    path("jobs/<str:job_id>/retry/", views.JobRetryView.as_view()),
    path("jobs/<str:job_id>/events/", views.JobEventListView.as_view()),
    path("jobs/<str:job_id>/artifacts/", views.JobArtifactListView.as_view()),
    path("artifacts/<str:artifact_id>/download/", views.ArtifactDownloadView.as_view()),
    path("credentials/", views.CredentialListView.as_view()),
    path("providers/", provider_views.ProviderListView.as_view()),
    path("providers/<str:target>/offers/", provider_views.OfferListView.as_view()),
    path("credentials/<str:credential_id>/", views.CredentialDetailView.as_view()),
    path(
        "webhooks/provider/<str:token>/",
        webhook_views.ProviderWebhookView.as_view(),
        name="provider-webhook",
    ),
    path("nodes/", node_views.NodeListView.as_view()),
    path("nodes/<str:name>/", node_views.NodeDetailView.as_view()),
    path("nodes/<str:name>/events/", node_views.NodeEventListView.as_view()),
    path("nodes/<str:name>/claim/", node_views.NodeClaimView.as_view(), name="node-claim"),
    path(
        "nodes/<str:name>/heartbeat/",
        node_views.NodeHeartbeatView.as_view(),
        name="node-heartbeat",
    ),
    path(
        "nodes/<str:name>/attempts/<str:job_id>/<int:attempt>/events/",
        node_views.NodeAttemptEventsView.as_view(),
        name="node-attempt-events",
    ),
    path("nodes/<str:name>/drain/", node_views.NodeActionView.as_view(action="drain")),
    path("nodes/<str:name>/undrain/", node_views.NodeActionView.as_view(action="undrain")),
    path(
        "nodes/<str:name>/rotate-token/", node_views.NodeActionView.as_view(action="rotate-token")
    ),
]
