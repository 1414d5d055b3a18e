"""`batchpilot ctl`: read and steer a running server through its control API (/control/*).

    batchpilot ctl get
    batchpilot ctl set max_num_seqs=64 lanes.batch.weight=2 --reason "incident 42"
    batchpilot ctl set lanes.bulk=null --move bulk=batch --dry-run
    batchpilot ctl profile degrade --reason overload
    batchpilot ctl rollback 3 && batchpilot ctl history
    batchpilot ctl drain --reason deploy && batchpilot ctl resume
    batchpilot ctl set max_num_seqs=1 --canary 1 --watch 5m   # a fleet: canary, then decide
    batchpilot ctl canary --follow                           # the fleet's canary

--url (default $BATCHPILOT_URL, else http://127.0.0.1:8000) names the server. The token is
read from the environment variable named by --token-env (default BATCHPILOT_TOKEN), never
from a flag, which would land in the shell history; with none set, none is sent.

Exit codes: 0 done; 1 the server could not be reached or failed, or has no such profile or
version; 2 a usage error or a change the server refused (bad value, lane not empty, stale
version); 3 the token is missing, wrong, or read-only; 4 a canary rolled the change back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from typing import Any

from control.cli import ctl_canary
from control.cli.ctl_error import CtlError
from control.cli.ctl_format import change_text, get_text, history_text, lanes_text
from control.cli.http_json import HTTPFailure, request_json
from control.trace.format import as_json
from engine.config.yaml_loader import KEY_ALIASES

URL_ENV, TOKEN_ENV = "BATCHPILOT_URL", "BATCHPILOT_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8000"
HTTP_TIMEOUT_S = 30.0


def exit_code(status: int) -> int:
    """HTTP status of a failed call -> exit code (see the module docstring)."""
    if status in (401, 403):
        return 3
    if status == 404 or status >= 500 or status < 400:
        return 1
    return 2  # 400, 409, 412, 428 and any other refusal of what was asked


# ---- KEY=VALUE -> JSON merge patch -----------------------------------------------------
def parse_value(text: str) -> Any:
    """JSON when it parses (64, 0.9, true, null, "text", {...}), else the text itself."""
    def no_constant(name: str) -> Any:
        raise ValueError(name)  # NaN and Infinity are not JSON: keep them as text

    try:
        return json.loads(text, parse_constant=no_constant)
    except ValueError:
        return text


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """'lanes.batch.weight=2' -> (['lanes', 'batch', 'weight'], 2); seed names aliased."""
    key, sep, value = text.partition("=")
    keys = key.split(".")
    if not sep or not key or not all(keys):
        raise CtlError(f"{text!r} is not KEY=VALUE with a dotted KEY (e.g. max_num_seqs=64,"
                       " lanes.batch.weight=2, lanes.bulk=null)", 2)
    keys[0] = KEY_ALIASES.get(keys[0], keys[0])
    return keys, parse_value(value)


def build_patch(assignments: list[str]) -> dict[str, Any]:
    """KEY=VALUE arguments -> one nested merge patch; a key given twice, or inside another
    given key (lanes.b=null with lanes.b.weight=2), is a usage error."""
    patch: dict[str, Any] = {}
    given: dict[tuple[str, ...], str] = {}
    for text in assignments:
        keys, value = parse_assignment(text)
        path = tuple(keys)
        for other, other_text in given.items():
            shorter = min(len(path), len(other))
            if path[:shorter] == other[:shorter]:
                raise CtlError(f"{text!r} and {other_text!r} set the same setting", 2)
        given[path] = text
        node = patch
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return patch


def parse_moves(moves: list[str] | None) -> dict[str, str]:
    """--move LANE=TARGET arguments -> lane_moves."""
    result: dict[str, str] = {}
    for text in moves or ():
        lane, sep, target = text.partition("=")
        if not sep or not lane or not target:
            raise CtlError(f"--move {text!r} is not LANE=TARGET (e.g. --move bulk=batch)", 2)
        result[lane] = target
    return result


# ---- HTTP ------------------------------------------------------------------------------
class Client:
    """The control API of one server, with the token (if any) from the environment."""

    def __init__(self, url: str, token_env: str):
        if not url.startswith(("http://", "https://")):
            raise CtlError(f"--url {url!r} must start with http:// or https://", 2)
        self.url, self.token_env = url.rstrip("/"), token_env
        self.token = os.environ.get(token_env) or None
        self.if_match: int | None = None

    def call(self, method: str, path: str, body: Any = None, *, dry_run: bool = False,
             if_match: int | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if if_match is not None:
            self.if_match = if_match  # for the message if the server answers 412
            headers["If-Match"] = str(if_match)
        try:
            return request_json(self.url, path + ("?dry_run=1" if dry_run else ""),
                                method=method, body=body, headers=headers,
                                timeout_s=HTTP_TIMEOUT_S)
        except HTTPFailure as exc:
            raise self._refusal(exc) from None

    def _refusal(self, exc: HTTPFailure) -> CtlError:
        if exc.status is None:  # unreachable, or not a JSON answer
            return CtlError(exc.message, 1)
        message, code = exc.message, exit_code(exc.status)
        if exc.status == 412 and "current_version" in exc.body:
            message = (f"the config changed since version {self.if_match} (now"
                       f" {exc.body['current_version']}): get it again and retry")
        elif code == 3:
            message += "; " + self._token_hint(exc.status)
        return CtlError(f"the server answered {exc.status}: {message}", code)

    def _token_hint(self, status: int) -> str:
        if not self.token:
            hint = f"no token was sent (${self.token_env} is not set)"
        elif status == 403:
            hint = f"the token in ${self.token_env} may only read; changes need an admin one"
        else:
            hint = f"check the token in ${self.token_env}"
        return hint + "; --token-env NAME reads it from another variable"


# ---- text ------------------------------------------------------------------------------
def _get(args: argparse.Namespace, client: Client) -> Any:
    return client.call("GET", "/control/config"), get_text


def _lanes(args: argparse.Namespace, client: Client) -> Any:
    data = client.call("GET", "/control/config")
    state = data.get("lanes_state", {})
    lanes = {name: {**lane, **state.get(name, {})}
             for name, lane in data["config"].get("lanes", {}).items()}
    return lanes, lambda _: "\n".join(lanes_text(data["config"], state, indent=""))


def _set(args: argparse.Namespace, client: Client) -> Any:
    body = {"changes": build_patch(args.assignments), "lane_moves": parse_moves(args.move),
            "reason": args.reason}
    if (args.watch or args.detach or args.min_requests is not None) and args.canary is None:
        raise CtlError("--watch, --detach and --min-requests go with --canary N", 2)
    version = args.if_match
    if version is None:
        version = client.call("GET", "/control/config")["version"]
    if args.canary is not None:
        return ctl_canary.start_command(args, client, body, version)
    data = client.call("PATCH", "/control/config", body, dry_run=args.dry_run,
                       if_match=version)
    return data, lambda d: change_text(d, args.dry_run, version)


def _post_change(args: argparse.Namespace, client: Client) -> Any:
    """profile NAME, rollback VERSION: the server builds the change; the answer is set's."""
    path = (f"/control/profiles/{urllib.parse.quote(args.name, safe='')}"
            if args.ctl_command == "profile"
            else f"/control/rollback/{_rollback_target(args.version, client)}")
    body = {"reason": args.reason, "lane_moves": parse_moves(args.move)}
    data = client.call("POST", path, body, dry_run=args.dry_run, if_match=args.if_match)
    return data, lambda d: change_text(d, args.dry_run)


def _rollback_target(version: str, client: Client) -> int:
    """VERSION as given, or `previous`: the version before the latest change (undo)."""
    if version != "previous":
        try:
            return int(version)
        except ValueError:
            raise CtlError(f"rollback: {version!r} is not a version number or 'previous'",
                           2) from None
    versions = client.call("GET", "/control/history")["versions"]
    if len(versions) < 2:
        raise CtlError("rollback previous: there is no earlier version in this server's"
                       " history", 2)
    return versions[-2]["version"]


def _history(args: argparse.Namespace, client: Client) -> Any:
    return client.call("GET", "/control/history"), history_text


def _admission(args: argparse.Namespace, client: Client) -> Any:
    """drain, resume: POST /control/drain or /control/resume."""
    data = client.call("POST", f"/control/{args.ctl_command}", {"reason": args.reason})
    return data, lambda d: f"admission: {d.get('admission', '-')}"


COMMANDS = {"get": _get, "set": _set, "lanes": _lanes, "profile": _post_change,
            "rollback": _post_change, "history": _history, "drain": _admission,
            "resume": _admission, "canary": ctl_canary.canary_command}


# ---- the parser ------------------------------------------------------------------------
def add_ctl_parser(sub: Any) -> None:
    """Register `batchpilot ctl` and its subcommands on `batchpilot`'s subparsers."""
    ctl = sub.add_parser(
        "ctl", help="read and change a running server's live config: get, set, lanes,"
        " profile, rollback, history, drain, resume", description="The operator CLI of"
        " the control API. The token is read from an environment variable, never a flag.")
    _connection_options(ctl, None)
    ctl.set_defaults(func=run, ctl_parser=ctl)
    cmds = ctl.add_subparsers(dest="ctl_command", metavar="SUBCOMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the server's raw JSON")
    _connection_options(common, argparse.SUPPRESS)  # also accepted after the subcommand
    reason = argparse.ArgumentParser(add_help=False)
    reason.add_argument("--reason", default="", metavar="TEXT", help="why, for the history")
    change = argparse.ArgumentParser(add_help=False, parents=[reason])
    change.add_argument("--dry-run", action="store_true",
                        help="validate and show the diff; apply nothing")
    change.add_argument("--move", action="append", metavar="LANE=TARGET",
                        help="where a removed lane's requests go (repeatable)")
    change.add_argument("--if-match", type=int, metavar="V",
                        help="apply only if the config is still at version V (set: default"
                        " the version read just before)")

    def add(name: str, help_: str, *parents: argparse.ArgumentParser) -> Any:
        return cmds.add_parser(name, help=help_, description=help_,
                               parents=[common, *parents])

    add("get", "the version, admission state, settings, lanes and profiles")
    p = add("set", "change live settings (a JSON merge patch built from KEY=VALUE)", change)
    p.add_argument("--canary", type=int, metavar="N", help="a fleet: apply to N replicas"
                   " first, compare them with the rest over --watch, then promote or roll"
                   " back by itself (docs/fleet.md)")
    p.add_argument("--watch", metavar="DURATION", help="the canary's window (30s, 5m, 1h;"
                   " default 5m); progress is printed a line per poll")
    p.add_argument("--detach", action="store_true", help="start the canary and return")
    p.add_argument("--min-requests", type=int, metavar="N",
                   help="requests each side needs for a decision (default 10)")
    p.add_argument("assignments", nargs="+", metavar="KEY=VALUE",
                   help="dotted KEY (max_num_seqs, lanes.batch.weight, tenant_lanes.acme);"
                   " VALUE is JSON if it parses, else text; lanes.NAME=null removes a lane")
    add("lanes", "the lanes: settings, running and waiting requests")
    p = add("profile", "apply a named profile from the serving config", change)
    p.add_argument("name", metavar="NAME")
    p = add("rollback", "install an earlier version's settings as a new version", change)
    p.add_argument("version", metavar="VERSION",
                   help="a version number from `history`, or `previous` (undo the latest"
                   " change)")
    add("history", "every config version: when, who, why, what changed")
    p = add("canary", "a fleet's running (or last) canary and its decision")
    p.add_argument("--follow", action="store_true", help="print each poll until it decides")
    add("drain", "stop admitting new requests (running ones finish)", reason)
    add("resume", "admit new requests again", reason)


def _connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--url", metavar="URL", default=default,
                        help=f"the server (default ${URL_ENV}, else {DEFAULT_URL})")
    parser.add_argument("--token-env", metavar="NAME", default=default,
                        help=f"environment variable holding the token (default {TOKEN_ENV})")
    parser.add_argument("--token", nargs="?", action=_RefuseToken, help=argparse.SUPPRESS)


class _RefuseToken(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        parser.error(f"{option}: a token on the command line lands in the shell history; put"
                     f" it in ${TOKEN_ENV}, or name another variable with --token-env")


def run(args: argparse.Namespace) -> int:
    """`batchpilot ctl ...`: print the answer; on failure, say why on stderr."""
    if args.ctl_command is None:
        args.ctl_parser.print_help(sys.stderr)
        return 2
    try:
        client = Client(args.url or os.environ.get(URL_ENV) or DEFAULT_URL,
                        args.token_env or TOKEN_ENV)
        data, text, *code = COMMANDS[args.ctl_command](args, client)
    except CtlError as exc:
        print(f"batchpilot ctl: error: {exc}", file=sys.stderr)
        return exc.code
    shown = as_json(data) if args.json else text(data)
    if shown:
        print(shown)
    return code[0] if code else 0
