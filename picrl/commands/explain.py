"""``picrl explain SERVICE``: why a running worker decided what it decided for one service."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from picrl.settings import SPECS

WEB_PORT = SPECS["web_port"].default


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "explain",
        help="show a service's state and last decisions from a running worker",
        description="Ask a running worker for GET /services/<id>: the service's range, calibrator margin and bias, "
        "prediction mu and sigma, risk buffer k*sigma, censoring streak and its last decisions with their "
        f"breakdown. A worker serves on port {WEB_PORT} unless set otherwise (--web-port); a second worker "
        "on the same host takes the next free port and logs its URL at start.",
    )
    parser.add_argument("service", help="service id")
    parser.add_argument(
        "--url",
        default=f"http://127.0.0.1:{WEB_PORT}",
        help="the web address of the worker that holds the service (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    parser.set_defaults(handler=run)


def fetch(url: str, service: str) -> tuple[int, dict[str, Any]]:
    address = f"{url.rstrip('/')}/services/{urllib.parse.quote(service, safe='')}"
    try:
        with urllib.request.urlopen(address, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except urllib.error.URLError as exc:
        raise ConnectionError(
            f"no worker answers at {url} ({exc.reason}): a worker serves on port {WEB_PORT} unless "
            "its --web-port says otherwise, and logs its URL at start"
        ) from None


def run(args: argparse.Namespace) -> int:
    status, body = fetch(args.url, args.service)
    if status != 200:
        print(body.get("error", f"the worker answered HTTP {status}"))
        return 1
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(
        f"service {body['service']}: {body['phase']}, next tick {body['next_tick']}, capacity {body['capacity']:.6g} "
        f"(policy version {body['policy_version']})"
    )
    if body["phase"] == "warmup":
        print(f"  warming up: {body['warmup_ticks_seen']} ticks observed before PIC-RL acts")
    else:
        low, high = body["range"]
        print(
            f"  range [{low:.6g}, {high:.6g}]; normalised capacity {body['capacity_norm']:.4f} = "
            f"mu {body['mu']:.4f} + k*sigma {body['k_sigma']:.4f} (k {body['k']:.3f}, sigma {body['sigma']:.4f}) "
            f"+ margin {body['margin']:+.4f} + bias {body['bias']:+.4f} + escape {body['escape']:.4f}, "
            "clipped to [0, 1]"
        )
        streak = body["censor_streak"]
        print(
            f"  censoring streak: {streak} tick(s)"
            + (" (in a censoring streak)" if body["in_censoring_streak"] else "")
        )
    print("  last decisions (tick: capacity, mu, k*sigma, margin, bias, clipped, version):")
    for action in body["last_decisions"]:
        print(
            f"    {action['tick']}: {action['capacity']:.6g}, {action['mu']:.4f}, {action['k_sigma']:.4f}, "
            f"{action['margin']:+.4f}, {action['bias']:+.4f}, {action['clipped']}, v{action['policy_version']}"
            + (" (advisory)" if action["advisory"] else "")
        )
    return 0
