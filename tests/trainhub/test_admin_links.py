"""The admin's user links lead to the operator's other tools: Flower and the API docs."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_every_admin_page_links_flower_and_the_api_docs(make_user, settings) -> None:
    settings.TRAINHUB_FLOWER_URL = "https://ops.example/flower/"
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))

    for page in ("/admin/", "/admin/jobs/trainingjob/", "/admin/jobs/gpunode/"):
        html = client.get(page).content.decode()
        assert 'href="https://ops.example/flower/"' in html, page
        assert 'href="/api/docs/"' in html, page
        assert "Log out" in html, "the admin's own links are still there"


def test_without_a_flower_url_there_is_no_flower_link(make_user, settings) -> None:
    settings.TRAINHUB_FLOWER_URL = ""
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    assert ">Flower<" not in client.get("/admin/").content.decode()


def test_the_login_page_shows_no_operator_links(settings) -> None:
    settings.TRAINHUB_FLOWER_URL = "https://ops.example/flower/"
    html = Client().get("/admin/login/").content.decode()
    assert "ops.example" not in html
