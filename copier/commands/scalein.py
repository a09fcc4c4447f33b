"""``copier scale-in-watch``: stop the service gracefully before Auto Scaling terminates the host.

On scale-in the Auto Scaling group puts the instance in ``Terminating:Wait``
(the lifecycle hook of scripts/copier.yaml) and the instance metadata's
``autoscaling/target-lifecycle-state`` turns to ``Terminated``. This watcher
(the unit copier-scale-in.service) polls that value; when it turns, it stops
copier.service (the daemon hands its leases over, every processor checkpoints
and releases its shard: successors take over without sleeping out a lease)
and then completes the lifecycle action so the termination goes on. If the
stop fails the action is still completed, with the result the hook's default
would give anyway: holding the host gains nothing, and the successors are
safe either way (they sleep out the lease).

The action is completed once, for this host, in its own group: only when
Auto Scaling itself says this instance is in ``Terminating:Wait`` (a hook
already completed has moved on to ``Terminating:Proceed``, so a restarted
watcher does not complete it again) and, when ``COPIER_AUTOSCALING_GROUP``
names the group (scripts/copier.yaml sets it), only in that group. After
completing it the watcher exits 0 and its unit (``Restart=on-failure``)
leaves it stopped.

Why poll the metadata rather than an EventBridge rule and SSM Run Command:
it needs no infrastructure beyond the hook, works on any host with IMDSv2,
and the decision stays on the host that must act on it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

__all__ = ["IMDS_URL", "Imds", "add_arguments", "main", "watch"]

log = structlog.get_logger("copier.commands.scalein")

IMDS_URL = "http://169.254.169.254"
TERMINATING = "Terminated"
WAITING = "Terminating:Wait"


@dataclass
class Imds:
    """IMDSv2: a session token, then plain GETs. ``None`` for a path that is not there (404)."""

    base_url: str = IMDS_URL
    timeout_s: float = 2.0
    token_ttl_s: int = 21600

    def _token(self) -> str:
        request = urllib.request.Request(
            self.base_url + "/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return str(response.read().decode())

    def get(self, path: str) -> str | None:
        request = urllib.request.Request(
            self.base_url + "/latest/meta-data/" + path, headers={"X-aws-ec2-metadata-token": self._token()}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return str(response.read().decode()).strip()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise


def watch(
    imds: Imds,
    autoscaling: Any,
    hook_name: str,
    stop: Callable[[], int],
    poll_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    group_name: str | None = None,
) -> str:
    """Wait for the host's scale-in, stop the service, complete the lifecycle action. Returns the result sent
    (``NONE`` when there was no action of this host's to complete)."""
    while True:
        try:
            state = imds.get("autoscaling/target-lifecycle-state")
        except OSError as e:  # metadata service briefly unreachable: keep watching
            log.warning("imds_unreachable", error=str(e))
            state = None
        if state == TERMINATING:
            break
        sleep(poll_s)
    instance_id = imds.get("instance-id")
    if not instance_id:
        raise RuntimeError("the instance metadata gives no instance-id")
    log.info("scale_in", instance_id=instance_id, action="stopping copier.service")
    started = time.monotonic()
    status = stop()
    log.info("service_stopped", status=status, seconds=round(time.monotonic() - started, 1))
    group = autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    mine = [g for g in group if g.get("InstanceId") == instance_id]
    if not mine:
        log.error("not_in_an_auto_scaling_group", instance_id=instance_id)
        return "NONE"
    if group_name is not None and mine[0]["AutoScalingGroupName"] != group_name:
        log.error("another_group", instance_id=instance_id, group=mine[0]["AutoScalingGroupName"], expected=group_name)
        return "NONE"
    if mine[0].get("LifecycleState") != WAITING:
        log.info("no_action_waiting", instance_id=instance_id, state=mine[0].get("LifecycleState"))
        return "NONE"
    result = "CONTINUE"
    autoscaling.complete_lifecycle_action(
        LifecycleHookName=hook_name,
        AutoScalingGroupName=mine[0]["AutoScalingGroupName"],
        InstanceId=instance_id,
        LifecycleActionResult=result,
    )
    log.info("lifecycle_action_completed", hook=hook_name, group=mine[0]["AutoScalingGroupName"])
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hook",
        default=os.environ.get("COPIER_LIFECYCLE_HOOK") or "copier-scale-in",
        help="the lifecycle hook's name (default: $COPIER_LIFECYCLE_HOOK or copier-scale-in)",
    )
    p.add_argument(
        "--stop-command",
        default="systemctl stop copier.service",
        help="how to stop the service gracefully (default: %(default)s)",
    )
    p.add_argument(
        "--group",
        default=os.environ.get("COPIER_AUTOSCALING_GROUP") or None,
        help="complete the hook only in this Auto Scaling group (default: $COPIER_AUTOSCALING_GROUP)",
    )
    p.add_argument("--poll-seconds", type=float, default=5.0)
    p.add_argument("--imds-url", default=IMDS_URL, help=argparse.SUPPRESS)
    p.add_argument("--region", help="the Auto Scaling group's region (default: the host's)")
    p.add_argument("--endpoint", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    import shlex

    import boto3

    from copier.adapters.logs import configure_logging

    configure_logging("INFO")
    imds = Imds(args.imds_url)
    region = args.region or imds.get("placement/region")
    autoscaling = boto3.session.Session().client("autoscaling", region_name=region, endpoint_url=args.endpoint)

    def stop() -> int:
        return subprocess.run(shlex.split(args.stop_command), stdout=sys.stderr).returncode

    watch(imds, autoscaling, args.hook, stop, args.poll_seconds, group_name=args.group)
    return 0
