"""jobs.services.accounts.targets on the real database: which key a project's provider calls use (its
own newest credential, else the operator's where allowed), the adapter built with it, and why
a project cannot use a target. Credentials are stored encrypted through the projects service;
the adapter is the scripted fake registered as a real target (tests/support/fakes/adapter.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobs import tasks
from jobs.models import Project
from jobs.services.accounts.projects import credential_create
from jobs.services.accounts.targets import (
    MissingCredentials,
    adapter_for,
    credential_source,
    provider_secrets,
    target_problem,
    target_secrets,
)
from jobs.states import JobStatus
from providers import registry
from tests.support.cloud import launched, poll_due
from tests.support.factories import ProjectFactory
from tests.support.fakes.adapter import FakeAdapter, register_fake

pytestmark = pytest.mark.django_db
S = JobStatus
OPERATOR_KEY = "rp-operator-KEY-31f0"


@pytest.fixture
def keyed(settings) -> Iterator[FakeAdapter]:
    """A fake target that needs a 'runpod' credential, like the real RunPod targets; no
    operator keys unless a test sets them."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.TRAINHUB_OPERATOR_API_KEYS = {}
    adapter = register_fake("keyed-cloud", credential_kind="runpod")
    yield adapter
    registry.unregister("keyed-cloud")


def target(name: str) -> registry.Target:
    found = registry.get(name)
    assert found is not None
    return found


def allow_operator_key(settings, project: Project, kind: str = "runpod") -> None:
    settings.TRAINHUB_OPERATOR_API_KEYS = {kind: OPERATOR_KEY}
    project.operator_credential_providers = [kind]
    project.save()


# --- whose key ------------------------------------------------------------------------------


def test_the_projects_newest_credential_is_used(keyed) -> None:
    project = ProjectFactory()
    credential_create(project=project, provider="runpod", name="old", secrets={"api_key": "k1"})
    newest = credential_create(
        project=project, provider="runpod", name="new", secrets={"api_key": "k2"}
    )
    assert provider_secrets(project=project, kind="runpod") == {"api_key": "k2"}
    assert credential_source(project=project, kind="runpod") == "project"

    newest.delete()
    assert provider_secrets(project=project, kind="runpod") == {"api_key": "k1"}


def test_another_projects_or_another_kinds_credential_is_not_used(keyed) -> None:
    project, other = ProjectFactory(), ProjectFactory()
    credential_create(project=other, provider="runpod", name="main", secrets={"api_key": "k"})
    credential_create(project=project, provider="vastai", name="main", secrets={"api_key": "v"})
    assert provider_secrets(project=project, kind="runpod") is None
    assert credential_source(project=project, kind="runpod") is None


def test_the_operators_key_is_used_only_by_projects_allowed_it(keyed, settings) -> None:
    allowed, other = ProjectFactory(), ProjectFactory()
    allow_operator_key(settings, allowed)

    assert provider_secrets(project=allowed, kind="runpod") == {"api_key": OPERATOR_KEY}
    assert credential_source(project=allowed, kind="runpod") == "operator"
    assert provider_secrets(project=other, kind="runpod") is None
    assert credential_source(project=other, kind="runpod") is None
    # Allowed for runpod only: the operator's key of another kind stays the operator's.
    assert provider_secrets(project=allowed, kind="vastai") is None


def test_a_projects_own_credential_wins_over_the_operators_key(keyed, settings) -> None:
    project = ProjectFactory()
    allow_operator_key(settings, project)
    credential_create(project=project, provider="runpod", name="own", secrets={"api_key": "own"})
    assert provider_secrets(project=project, kind="runpod") == {"api_key": "own"}
    assert credential_source(project=project, kind="runpod") == "project"


def test_a_project_allowed_the_operators_key_has_none_when_the_operator_set_none(
    keyed, settings
) -> None:
    project = ProjectFactory(operator_credential_providers=["runpod"])
    settings.TRAINHUB_OPERATOR_API_KEYS = {"runpod": ""}
    assert provider_secrets(project=project, kind="runpod") is None
    assert credential_source(project=project, kind="runpod") is None


# --- the secrets and the adapter of a target --------------------------------------------------


def test_a_target_needing_no_credential_is_built_with_no_secrets(fake_cloud) -> None:
    assert target_secrets(target("fake-cloud"), ProjectFactory()) == {}


def test_a_target_whose_credential_is_gone_says_which_project_lacks_which_kind(keyed) -> None:
    project = ProjectFactory(slug="vision-lab")
    with pytest.raises(MissingCredentials) as info:
        target_secrets(target("keyed-cloud"), project)
    assert str(info.value) == "project vision-lab has no 'runpod' credential any more"
    with pytest.raises(MissingCredentials):
        adapter_for(target("keyed-cloud"), project)
    assert keyed.secrets_seen == [], "no adapter was built without a key"


def test_the_adapter_is_built_with_the_projects_key(keyed) -> None:
    project = ProjectFactory()
    credential_create(project=project, provider="runpod", name="main", secrets={"api_key": "k"})
    assert adapter_for(target("keyed-cloud"), project) is keyed
    assert keyed.secrets_seen == [{"api_key": "k"}]


def test_secrets_already_looked_up_are_not_looked_up_again(keyed) -> None:
    project = ProjectFactory()  # no credential: a lookup would raise MissingCredentials
    adapter_for(target("keyed-cloud"), project, {"api_key": "given"})
    assert keyed.secrets_seen == [{"api_key": "given"}]


def test_the_own_fleet_has_no_adapter() -> None:
    own_fleet = target("local")
    with pytest.raises(ValueError, match="target local has no provider adapter"):
        adapter_for(own_fleet, ProjectFactory())


# --- why a project cannot use a target --------------------------------------------------------


def test_the_own_fleet_is_usable_by_any_project(settings) -> None:
    settings.TRAINHUB_PUBLIC_URL = ""
    assert target_problem(project=ProjectFactory(), target=target("local")) is None


def test_a_target_the_operator_did_not_configure_is_unavailable(settings) -> None:
    settings.RUNPOD_ENDPOINT_ID = ""
    problem = target_problem(project=ProjectFactory(), target=target("runpod-serverless"))
    assert problem == (
        "target_unavailable",
        "target 'runpod-serverless' is not available: the operator has not set RUNPOD_ENDPOINT_ID.",
    )


def test_a_cloud_target_needs_storage_a_rented_machine_can_reach(keyed, settings) -> None:
    project = ProjectFactory()
    credential_create(project=project, provider="runpod", name="main", secrets={"api_key": "k"})
    settings.TRAINHUB_STORAGE = "local"
    settings.TRAINHUB_PUBLIC_URL = ""

    code, message = target_problem(project=project, target=target("keyed-cloud")) or ("", "")
    assert code == "storage_unreachable"
    assert "TRAINHUB_STORAGE=s3" in message and "TRAINHUB_PUBLIC_URL" in message

    settings.TRAINHUB_PUBLIC_URL = "https://trainhub.example.org"
    assert target_problem(project=project, target=target("keyed-cloud")) is None


def test_a_target_without_a_usable_key_says_how_to_add_one(keyed, settings) -> None:
    project = ProjectFactory()
    code, message = target_problem(project=project, target=target("keyed-cloud")) or ("", "")
    assert code == "missing_credentials"
    assert "needs a 'runpod' credential" in message and "/api/v1/credentials/" in message

    allow_operator_key(settings, project)
    assert target_problem(project=project, target=target("keyed-cloud")) is None


# --- the key the launch and poll paths use, the API's refusal ---------------------------------


def test_the_projects_newest_credential_is_used_then_the_operators(
    keyed, make_job, project, settings, sent
) -> None:
    settings.TRAINHUB_OPERATOR_API_KEYS = {"runpod": "rp-operator"}
    project.operator_credential_providers = ["runpod"]
    project.save()
    job = make_job(target="keyed-cloud")  # accepted on the operator's key alone
    tasks.place_job(job.pk)
    assert keyed.secrets_seen[-1] == {"api_key": "rp-operator"}

    credential_create(project=project, provider="runpod", name="old", secrets={"api_key": "k1"})
    credential_create(project=project, provider="runpod", name="new", secrets={"api_key": "k2"})
    poll_due("keyed-cloud")
    assert keyed.secrets_seen[-1] == {"api_key": "k2"}, "the project's own key wins"


def test_an_attempt_whose_credential_vanished_ends_with_a_clear_reason(
    keyed, make_job, project, sent
) -> None:
    credential_create(project=project, provider="runpod", name="main", secrets={"api_key": "k"})
    job, _attempt = launched(make_job, target="keyed-cloud", max_attempts=1)
    project.credentials.all().delete()

    poll_due("keyed-cloud")

    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "provider_error")
    assert "has no 'runpod' credential any more" in job.error_message


def test_an_unconfigured_target_is_refused_at_submit(api, make_file, settings) -> None:
    settings.RUNPOD_ENDPOINT_ID = ""
    settings.TRAINHUB_PUBLIC_URL = "https://trainhub.example.org"
    body = {"model": "acme/tiny", "training_file": make_file().public_id}
    response = api.post("/api/v1/jobs/", {**body, "target": "runpod-serverless"}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("target_unavailable", "target")
    assert "RUNPOD_ENDPOINT_ID" in error["message"]
