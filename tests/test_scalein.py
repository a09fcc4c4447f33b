"""copier scale-in-watch: on scale-in, stop the service first, then let Auto Scaling terminate the host.

The instance metadata service is served here on 127.0.0.1 (IMDSv2: a token
is required); the Auto Scaling client records its calls, because the local
backend (moto) does not implement CompleteLifecycleAction.
"""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from typing import Any

import pytest

from copier.commands.scalein import Imds, watch
from tests.support.serving import serving

TOKEN = "token-123"


class _Metadata(http.server.ThreadingHTTPServer):
    def __init__(self, states: list[str | None]) -> None:
        self.states = states  # successive answers for target-lifecycle-state (None: 404)
        self.asked = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: str = "") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._answer(200, TOKEN)
                else:
                    self._answer(400)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    self._answer(401)
                elif self.path == "/latest/meta-data/instance-id":
                    self._answer(200, "i-0abc")
                elif self.path == "/latest/meta-data/autoscaling/target-lifecycle-state":
                    state = server.states[min(server.asked, len(server.states) - 1)]
                    server.asked += 1
                    self._answer(404) if state is None else self._answer(200, state)
                else:
                    self._answer(404)

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def metadata(request: pytest.FixtureRequest) -> Iterator[_Metadata]:
    with serving(_Metadata(request.param)) as server:
        yield server


class _AutoScaling:
    """Records the calls; answers DescribeAutoScalingInstances like Auto Scaling does."""

    def __init__(self, groups: list[dict[str, str]]) -> None:
        self.groups = groups
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def describe_auto_scaling_instances(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("describe", kwargs))
        return {"AutoScalingInstances": self.groups}

    def complete_lifecycle_action(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("complete", kwargs))
        return {}


@pytest.mark.parametrize("metadata", [[None, "InService", "InService", "Terminated"]], indirect=True)
def test_scale_in_stops_the_service_then_completes_the_lifecycle_action(metadata: _Metadata) -> None:
    autoscaling = _AutoScaling([_waiting()])
    events: list[str] = []

    def stop() -> int:
        events.append(f"stop after {len(autoscaling.calls)} calls")
        return 0

    imds = Imds(f"http://127.0.0.1:{metadata.server_address[1]}")
    result = watch(imds, autoscaling, "copier-scale-in", stop, 0.01, group_name="prod-copier")
    assert result == "CONTINUE"
    assert metadata.asked == 4, "watched until the state turned to Terminated"
    assert events == ["stop after 0 calls"], "the service is stopped before anything is told to Auto Scaling"
    assert autoscaling.calls[-1] == (
        "complete",
        {
            "LifecycleHookName": "copier-scale-in",
            "AutoScalingGroupName": "prod-copier",
            "InstanceId": "i-0abc",
            "LifecycleActionResult": "CONTINUE",
        },
    )


def _waiting(group: str = "prod-copier", state: str = "Terminating:Wait") -> dict[str, str]:
    return {"AutoScalingGroupName": group, "InstanceId": "i-0abc", "LifecycleState": state}


@pytest.mark.parametrize("metadata", [["Terminated"]], indirect=True)
@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_waiting(state="Terminating:Proceed"), "already completed (a restarted watcher)"),
        (_waiting(group="other-copier"), "a host of another group"),
    ],
)
def test_the_hook_is_completed_only_while_this_host_waits_in_its_group(
    metadata: _Metadata, answer: dict[str, str], why: str
) -> None:
    """Once, for this instance, in the group named: never again after success, never in another group."""
    autoscaling = _AutoScaling([answer])
    imds = Imds(f"http://127.0.0.1:{metadata.server_address[1]}")
    result = watch(imds, autoscaling, "copier-scale-in", lambda: 0, 0.01, group_name="prod-copier")
    assert result == "NONE" and [name for name, _ in autoscaling.calls] == ["describe"], why


@pytest.mark.parametrize("metadata", [["Terminated"]], indirect=True)
def test_a_host_outside_any_group_completes_nothing(metadata: _Metadata) -> None:
    autoscaling = _AutoScaling([])
    result = watch(Imds(f"http://127.0.0.1:{metadata.server_address[1]}"), autoscaling, "hook", lambda: 0, 0.01)
    assert result == "NONE" and [name for name, _ in autoscaling.calls] == ["describe"]


def test_an_unreachable_metadata_service_is_waited_for() -> None:
    """No metadata (a connection refused) is not a scale-in: the watcher keeps waiting."""
    sleeps: list[float] = []

    class Stop(Exception):
        pass

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise Stop

    with pytest.raises(Stop):
        watch(Imds("http://127.0.0.1:9", timeout_s=0.5), _AutoScaling([]), "hook", lambda: 0, 0.01, sleep)
    assert sleeps == [0.01, 0.01, 0.01]
