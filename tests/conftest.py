"""Shared test fixtures.

Triton: `start_triton` (per test) and `start_triton_module` (per module) are factories:
``server = start_triton(repository, **TritonServer_kwargs)`` starts a real tritonserver on
free loopback ports, waits until every model is ready and returns the `TritonServer`
(``server.http_url``, ``server.grpc_url``, ``server.metrics_url``). Every server a factory
started is stopped when its scope ends — also when the test fails or start-up raises.
Logs go to the test's tmp dir unless ``log_path`` is given. A test that starts a server is
marked ``triton`` (enforced here: unmarked tests cannot start one), so ``pytest -m 'not
triton'`` runs the pure suite.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from tokenrouter_backend.server.process import TritonServer

TEST_READY_TIMEOUT_S = 120.0  # tiny models load in seconds; this only bounds a hang

pytest_plugins = ("support.fixtures_engine", "support.fixtures_export")  # shared fixtures

StartTriton = Callable[..., TritonServer]


TRITON_FIXTURES = {"start_triton", "start_triton_module"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that asks for a tritonserver fixture must carry the ``triton`` marker."""
    unmarked = [item.nodeid for item in items
                if TRITON_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("triton") is None]
    if unmarked:
        raise pytest.UsageError("tests start a tritonserver without @pytest.mark.triton:\n  "
                                + "\n  ".join(unmarked))


@pytest.fixture(autouse=True)
def _no_tritonserver_unless_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside ``triton``-marked tests, starting a TritonServer fails the test at once."""
    if request.node.get_closest_marker("triton") is None:
        def refuse(self):
            raise AssertionError(f"{request.node.nodeid} starts a tritonserver: mark it @pytest.mark.triton")
        monkeypatch.setattr(TritonServer, "start", refuse)


def _triton_factory(log_dir: Path) -> Iterator[StartTriton]:
    started: list[TritonServer] = []

    def start(repository: Path, **kwargs) -> TritonServer:
        kwargs.setdefault("log_path", log_dir / f"tritonserver-{len(started)}.log")
        kwargs.setdefault("ready_timeout_s", TEST_READY_TIMEOUT_S)
        server = TritonServer(repository, **kwargs)
        started.append(server)  # before start(): stopped even if start-up raises
        server.start()
        server.wait_ready()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def start_triton(tmp_path: Path) -> Iterator[StartTriton]:
    yield from _triton_factory(tmp_path)


@pytest.fixture(scope="module")
def start_triton_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartTriton]:
    yield from _triton_factory(tmp_path_factory.mktemp("triton"))


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair exported into a model repository filled from THIS checkout's template.

    The pair and its ONNX exports are cached in the data dir (the exporter's stamps make a
    second build a no-op); the repository itself is written per test session, so checkouts
    with different templates never see each other's configs.
    """
    from tokenrouter_backend.export.pipeline import ExportOptions, export_pair
    from tokenrouter_backend.export.tiny_pair import build_tiny_pair
    from tokenrouter_backend.server import paths

    heavy, light = build_tiny_pair(paths.tiny_dir())
    out = tmp_path_factory.mktemp("tiny") / "repository"
    options = ExportOptions(template=Path(__file__).resolve().parent.parent / "model_repository",
                            work_dir=paths.tiny_dir() / "onnx")
    export_pair(heavy, light, out, options)
    return out
