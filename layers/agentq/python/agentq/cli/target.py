"""Which API a remote command talks to: flags, then a profile, then the environment.

URL and key come from --url/--api-key, then an explicit profile (--profile or
$AGENTQ_PROFILE), then $AGENTQ_URL/$AGENTQ_API_KEY, then the [default] profile of
``profiles.toml``. There is no implicit local stack: it lives only while ``agentq dev`` runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentq.cli.args import UsageError, read_text

if TYPE_CHECKING:
    from agentq.api.client import Client


def profiles_path() -> Path:
    if os.environ.get("AGENTQ_PROFILES"):
        return Path(os.environ["AGENTQ_PROFILES"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "agentq" / "profiles.toml"


def _load_profiles(path: Path) -> dict[str, dict[str, Any]]:
    import tomllib

    if not path.exists():
        return {}
    try:
        data = tomllib.loads(read_text(str(path), what="profiles", field="profile"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"cannot read profiles from {path}: {exc}", field="profile") from None
    return {name: value for name, value in data.items() if isinstance(value, dict)}


NO_TARGET = (
    "no API to talk to. Set AGENTQ_URL (and AGENTQ_API_KEY if the API needs a key), pass --url/--api-key, "
    'or name a profile with --profile (profiles live in {path}, e.g. [default] url = "..." api_key = "..."). '
    "There is no implicit local stack: it lives only while `agentq dev` runs, so start `agentq dev` in another "
    "shell and export the AGENTQ_URL it prints."
)


def resolve_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """URL and key: flags, then an explicit profile (--profile or AGENTQ_PROFILE), then
    AGENTQ_URL/AGENTQ_API_KEY, then the [default] profile."""
    url, key = getattr(args, "url", None), getattr(args, "api_key", None)
    path = profiles_path()
    name = getattr(args, "profile", None) or os.environ.get("AGENTQ_PROFILE")
    profile: dict[str, Any] = {}
    if name:
        profiles = _load_profiles(path)
        if name not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise UsageError(f"no profile {name!r} in {path} (profiles: {known})", field="profile")
        profile = profiles[name]
    else:
        url = url or os.environ.get("AGENTQ_URL")
        key = key or os.environ.get("AGENTQ_API_KEY")
        if not url:
            profile = _load_profiles(path).get("default", {})
    url = url or profile.get("url")
    key = key or profile.get("api_key")
    if not url:
        raise UsageError(NO_TARGET.format(path=path), field="url")
    if not str(url).startswith(("http://", "https://")):
        raise UsageError(f"the API's URL must start with http:// or https:// (got {url!r})", field="url")
    return str(url), (str(key) if key else None)


def api_client(args: argparse.Namespace) -> Client:
    from agentq.api.client import Client

    url, key = resolve_target(args)
    return Client(url, key)


def remote(
    parser: argparse.ArgumentParser, json_help: str = "print the API's JSON instead of text", *, json: bool = True
) -> argparse.ArgumentParser:
    """The options of a command that talks to the API: where it is, and --json unless ``json`` is
    False (a command with nothing to print as JSON: a live view, files written, a conversation),
    so that no command offers a flag it ignores."""
    group = parser.add_argument_group("API")
    group.add_argument("--url", help="API URL (default: $AGENTQ_URL or the profile's url)")
    group.add_argument("--api-key", help="API key (default: $AGENTQ_API_KEY or the profile's api_key)")
    group.add_argument("--profile", help="a profile of ~/.config/agentq/profiles.toml (default: $AGENTQ_PROFILE)")
    if json:
        parser.add_argument("--json", action="store_true", help=json_help)
    return parser
