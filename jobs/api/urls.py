from django.urls import path

from jobs.api import views

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
    path("credentials/<str:credential_id>/", views.CredentialDetailView.as_view()),
]
