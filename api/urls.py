from api import (
    audit_views,
    node_views,
    openai_urls,
    provider_views,
    views,
    webhook_endpoint_views,
    webhook_views,
)
from api.routes import route

# trainhub's native paths; OpenAI's (files, fine_tuning/jobs) come first, from openai_urls.
urlpatterns = [
    *openai_urls.urlpatterns,
    *route("jobs", views.JobListView.as_view()),
    *route("jobs/<str:job_id>", views.JobDetailView.as_view()),
    *route("jobs/<str:job_id>/cancel", views.JobCancelView.as_view()),
    *route("jobs/<str:job_id>/retry", views.JobRetryView.as_view()),
    *route("jobs/<str:job_id>/events", views.JobEventListView.as_view()),
    *route("jobs/<str:job_id>/artifacts", views.JobArtifactListView.as_view()),
    *route("artifacts/<str:artifact_id>/download", views.ArtifactDownloadView.as_view()),
    *route("credentials", views.CredentialListView.as_view()),
    *route("providers", provider_views.ProviderListView.as_view()),
    *route("providers/<str:target>/offers", provider_views.OfferListView.as_view()),
    *route("credentials/<str:credential_id>", views.CredentialDetailView.as_view()),
    *route(
        "webhooks/provider/<str:token>",
        webhook_views.ProviderWebhookView.as_view(),
        name="provider-webhook",
    ),
    # Outbound webhooks: the project's endpoints and their delivery log.
    *route("webhook_endpoints", webhook_endpoint_views.WebhookEndpointListView.as_view()),
    *route(
        "webhook_endpoints/<str:endpoint_id>",
        webhook_endpoint_views.WebhookEndpointDetailView.as_view(),
    ),
    *route(
        "webhook_endpoints/<str:endpoint_id>/rotate_secret",
        webhook_endpoint_views.WebhookEndpointRotateView.as_view(),
    ),
    *route(
        "webhook_endpoints/<str:endpoint_id>/deliveries",
        webhook_endpoint_views.WebhookDeliveryListView.as_view(),
    ),
    *route(
        "webhook_endpoints/<str:endpoint_id>/deliveries/<str:delivery_id>/redeliver",
        webhook_endpoint_views.WebhookRedeliverView.as_view(),
    ),
    # The audit trail (operators).
    *route("audit", audit_views.AuditListView.as_view()),
    *route("nodes", node_views.NodeListView.as_view()),
    *route("nodes/<str:name>", node_views.NodeDetailView.as_view()),
    *route("nodes/<str:name>/events", node_views.NodeEventListView.as_view()),
    *route("nodes/<str:name>/claim", node_views.NodeClaimView.as_view(), name="node-claim"),
    *route(
        "nodes/<str:name>/heartbeat",
        node_views.NodeHeartbeatView.as_view(),
        name="node-heartbeat",
    ),
    *route(
        "nodes/<str:name>/attempts/<str:job_id>/<int:attempt>/events",
        node_views.NodeAttemptEventsView.as_view(),
        name="node-attempt-events",
    ),
    *route("nodes/<str:name>/drain", node_views.NodeActionView.as_view(action="drain")),
    *route("nodes/<str:name>/undrain", node_views.NodeActionView.as_view(action="undrain")),
    *route(
        "nodes/<str:name>/rotate-token", node_views.NodeActionView.as_view(action="rotate-token")
    ),
]
