"""``llmrl run``'s own Prefect API: it answers while the run's block runs and never outlives the block."""

from __future__ import annotations

import urllib.request

import psutil
import pytest

from llmrl_cli.run_api import run_api


def _api_children() -> list[psutil.Process]:
    return [c for c in psutil.Process().children() if "llmrl_cli.api_child" in " ".join(c.cmdline())]


@pytest.fixture
def no_api_url(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    (tmp_path / "prefect").mkdir()


@pytest.mark.engine
def test_the_api_answers_in_the_block_and_is_gone_after_it(no_api_url):
    from prefect.settings import PREFECT_API_URL

    with run_api() as url:
        assert url is not None and url.startswith("http://127.0.0.1:") and PREFECT_API_URL.value() == url
        assert len(_api_children()) == 1
        with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:
            assert reply.status == 200
    assert _api_children() == []


@pytest.mark.engine
def test_an_error_in_the_block_stops_the_api(no_api_url):
    with pytest.raises(KeyError, match="the run failed"):
        with run_api():
            raise KeyError("the run failed")
    assert _api_children() == []


def test_with_an_api_set_no_server_starts(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    with run_api() as url:
        assert url is None and _api_children() == []


@pytest.mark.engine
def test_without_a_prefect_home_the_api_lives_in_llmrls_home_not_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.setenv("LLMRL_HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    with run_api() as url:
        assert url is not None
    assert list((tmp_path / "cwd").iterdir()) == []
    assert (tmp_path / "home" / "prefect" / "run-api.log").exists()
    assert (tmp_path / "home" / "prefect" / "prefect.db").exists()  # the API's database went there too
